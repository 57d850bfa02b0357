"""The demo's table: from CRI logs and placements to the rows a person reads."""

from __future__ import annotations

import json

import pytest

from hack.localup import report
from hack.localup.report import PodOutcome, Share, Status

UUID_A = "GPU-74106407-f32f-4663-80a7-a1acf7eb04ae"
UUID_B = "GPU-08f22e65-3b2d-49a7-8659-c71f416a3808"
GI = 2**30


def test_cri_log_lines_are_read_back_with_partial_lines_joined() -> None:
    text = (
        "2026-01-01T00:00:00.000000001Z stdout F A=1\n"
        "2026-01-01T00:00:00.000000002Z stdout P B=very\n"
        "2026-01-01T00:00:00.000000003Z stdout F long\n"
        "2026-01-01T00:00:00.000000004Z stderr F \n"
    )
    assert report.parse_cri_log(text) == ["A=1", "B=verylong", ""]


def test_env_output_becomes_a_mapping_and_values_keep_their_equals_signs() -> None:
    env = report.env_from_lines(["PATH=/bin", "OPTS=a=b", "not a variable", "=x"])
    assert env == {"PATH": "/bin", "OPTS": "a=b"}


@pytest.mark.parametrize(
    ("shares", "text"),
    [
        ((), "-"),
        ((Share(minor=0, uuid=UUID_A, core_percent=50, memory_bytes=40 * GI),), "0 (50%, 40Gi)"),
        (
            (Share(minor=2, uuid=UUID_A, core_percent=100, memory_bytes=80 * GI),
             Share(minor=3, uuid=UUID_B, core_percent=100, memory_bytes=80 * GI)),
            "2,3 (whole)",
        ),
        ((Share(minor=1, uuid=UUID_A, core_percent=25, memory_bytes=512 * 2**20),), "1 (25%, 512Mi)"),
    ],
)
def test_shares_read_as_minor_and_share_or_whole(shares: tuple[Share, ...], text: str) -> None:
    assert report.describe_shares(shares) == text


@pytest.mark.parametrize(
    ("env", "text"),
    [
        ({"CUDA_DEVICE_MEMORY_LIMIT_0": "40960m", "FGPU_GPU_MEMORY_BYTES": "1"}, "CUDA_DEVICE_MEMORY_LIMIT_0=40960m"),
        (
            {"CUDA_DEVICE_MEMORY_LIMIT_1": "100m", "CUDA_DEVICE_MEMORY_LIMIT_0": "100m"},
            "CUDA_DEVICE_MEMORY_LIMIT_{0..1}=100m",
        ),
        (
            {"CUDA_DEVICE_MEMORY_LIMIT_0": "100m", "CUDA_DEVICE_MEMORY_LIMIT_1": "200m"},
            "CUDA_DEVICE_MEMORY_LIMIT_0=100m CUDA_DEVICE_MEMORY_LIMIT_1=200m",
        ),
        ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M"}, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M"),
        ({"FGPU_GPU_MEMORY_BYTES": "5,5,5,5"}, "FGPU_GPU_MEMORY_BYTES=5 (x4)"),
        ({"PATH": "/bin"}, "-"),
    ],
)
def test_the_memory_limit_column_prefers_what_the_isolation_backend_enforces(env: dict[str, str], text: str) -> None:
    assert report.memory_limit(env) == text


def test_gpu_uuids_are_shortened_but_void_and_all_are_kept() -> None:
    assert report.short_devices(f"{UUID_A},{UUID_B}") == "GPU-74106407,GPU-08f22e65"
    assert report.short_devices("void") == "void"
    assert report.short_devices("all") == "all"


def test_the_table_shows_where_each_pod_went_and_why_one_did_not_fit() -> None:
    outcomes = [
        PodOutcome(
            name="half-gpu", namespace="demo", status=Status.COMPLETED, node="fgpu-local", source="koordinator",
            shares=(Share(minor=0, uuid=UUID_A, core_percent=50, memory_bytes=40 * GI),),
            env={"NVIDIA_VISIBLE_DEVICES": UUID_A, "CUDA_DEVICE_MEMORY_LIMIT_0": "40960m"},
        ),
        PodOutcome(name="too-big", namespace="demo", status=Status.PENDING, source="koordinator",
                   reason="fgpu-local: 3 of 8 GPUs free, pod needs 4 whole GPUs"),
        PodOutcome(name="plain", namespace="demo", status=Status.COMPLETED, node="fgpu-local",
                   env={"NVIDIA_VISIBLE_DEVICES": "void"}),
    ]
    lines = report.table(outcomes, max_width=200).splitlines()
    assert lines[0].split() == ["POD", "NODE", "GPU(S)", "AND", "SHARE", "NVIDIA_VISIBLE_DEVICES", "MEMORY", "LIMIT", "ENV", "STATUS"]
    assert lines[1].split() == [
        "half-gpu", "[koordinator]", "fgpu-local", "0", "(50%,", "40Gi)", "GPU-74106407", "CUDA_DEVICE_MEMORY_LIMIT_0=40960m", "Completed",
    ]
    assert "Pending: fgpu-local: 3 of 8 GPUs free, pod needs 4 whole GPUs" in lines[2]
    assert lines[3].split() == ["plain", "-", "void", "-", "Completed"]


def test_long_cells_are_cut_in_the_table_but_kept_whole_in_the_json() -> None:
    reason = "x" * 300
    outcome = PodOutcome(name="p", namespace="demo", status=Status.PENDING, reason=reason)
    text = report.table([outcome], max_width=40)
    assert "x" * 41 not in text and text.rstrip().endswith("...")
    assert json.loads(report.to_json([outcome]))["pods"][0]["reason"] == reason
    assert report.reasons([outcome]) == f"p: Pending: {reason}"


def test_pods_that_completed_have_no_reason_to_list() -> None:
    assert report.reasons([PodOutcome(name="p", namespace="demo", status=Status.COMPLETED)]) == ""
