"""The example manifests in examples/pods/: valid ones parse, each invalid one fails for its stated reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from apis.request import RequestError, parse_pod

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pods"

#: invalid example -> a fragment of the error it must produce
INVALID_BECAUSE = {
    "core-alone.yaml": "core alone is invalid",
    "fractional.yaml": "is fractional",
    "hami-cores-over-100.yaml": "cannot exceed 100",
    "limits-differ.yaml": "limits must equal requests",
    "memory-and-ratio.yaml": "memory and memory-ratio together are invalid",
    "mixed-styles-across-containers.yaml": "must ask for GPUs in one style",
    "negative.yaml": "is negative",
    "non-numeric.yaml": "is not a number",
    "percent-150.yaml": "must be a multiple of 100",
    "shared-not-multiple.yaml": "is not a multiple of koordinator.sh/gpu.shared=2",
    "shared-over-100.yaml": "more than 100 per card",
    "vendor-mixed.yaml": "mixed with koordinator resources is invalid",
}


def pods_in(path: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for document in yaml.safe_load_all(path.read_text()):
        items = document.get("items", [document]) if document.get("kind") == "List" else [document]
        out.extend(item for item in items if item.get("kind") == "Pod")
    return out


#: valid example -> (gpus, core percent per card, source) of each Pod in it; None for a pod with no GPU
VALID_AS = {
    "aliyun-share.yaml": [(1, 0, "aliyun")],
    "cpu-only.yaml": [None],
    "hami-share.yaml": [(2, 30, "hami")],
    "init-containers.yaml": [(1, 50, "koordinator")],
    "koordinator-gpu.yaml": [(2, 100, "koordinator")],
    "koordinator-memory-only.yaml": [(1, 0, "koordinator")],
    "koordinator-share-memory.yaml": [(1, 50, "koordinator")],
    "koordinator-share-ratio.yaml": [(1, 25, "koordinator")],
    "koordinator-shared-spread.yaml": [(2, 50, "koordinator")],
    "koordinator-two-whole.yaml": [(2, 100, "koordinator")],
    "nvidia-whole.yaml": [(1, 100, "nvidia")],
    "pod-list.json": [(1, 30, "koordinator"), (1, 30, "koordinator")],
    "qgpu-share.yaml": [(1, 40, "qgpu")],
    "training-job.yaml": [],  # a Job: fgpuctl validate reads its template (tests/fgpuctl_validate)
    "volcano-share.yaml": [(1, 50, "volcano")],
    # A zero is no request, as in Koordinator (utils.go, GetPodDeviceRequests: quotav1.RemoveZeros).
    "zero.yaml": [None],
}


@pytest.mark.parametrize("name", sorted(VALID_AS))
def test_valid_examples_parse_to_their_stated_request(name: str) -> None:
    got = []
    for manifest in pods_in(EXAMPLES / "valid" / name):
        request = parse_pod(manifest)
        got.append(None if request is None else (request.gpus, request.core_percent, request.source))
    assert got == VALID_AS[name]


def test_every_valid_example_has_a_stated_request() -> None:
    assert sorted(p.name for p in (EXAMPLES / "valid").iterdir()) == sorted(VALID_AS)


@pytest.mark.parametrize("name", sorted(INVALID_BECAUSE))
def test_invalid_examples_fail_for_their_stated_reason(name: str) -> None:
    (manifest,) = pods_in(EXAMPLES / "invalid" / name)
    with pytest.raises(RequestError) as caught:
        parse_pod(manifest)
    assert any(INVALID_BECAUSE[name] in e for e in caught.value.errors), caught.value.errors


def test_every_invalid_example_has_a_stated_reason() -> None:
    assert sorted(p.name for p in (EXAMPLES / "invalid").iterdir()) == sorted(INVALID_BECAUSE)
