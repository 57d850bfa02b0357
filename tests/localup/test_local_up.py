"""hack/local-up.sh end to end, as the README runs it: real containerd, the three fgpu daemons, the demo pods.

Each run gets its own work directory, so these tests never touch a stack a
person started with the default one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from apis import names
from tests.localup.manifests import REPO

SCRIPT = REPO / "hack" / "local-up.sh"

pytestmark = [
    pytest.mark.containerd,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="local-up needs root for containerd and runc"),
    pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd is not installed"),
]


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Short, under /tmp: unix socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="fgpu-lu-", dir="/tmp"))
    yield path
    subprocess.run([str(SCRIPT), "--down", "--workdir", str(path)], capture_output=True, timeout=120, check=False)
    shutil.rmtree(path, ignore_errors=True)


def local_up(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout_s, check=False, cwd=REPO
    )


def leftovers(workdir: Path, runtime_ids: Collection[str] = ()) -> list[str]:
    """Processes whose command line names the work directory or whose cgroup is one of our
    sandboxes or containers, and mounts under the work directory."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroup = Path(f"/proc/{entry}/cgroup").read_text()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":  # exited, waiting for init to reap it
            continue
        if str(workdir) in cmdline or any(i in cgroup for i in runtime_ids):
            found.append(f"pid {entry}: {cmdline.strip()}")
    with open("/proc/self/mounts") as f:
        found += [f"mount {line.split()[1]}" for line in f if line.split()[1].startswith(str(workdir))]
    return found


def demo_pods() -> dict[str, dict[str, Any]]:
    pods = {}
    for path in sorted((REPO / "examples" / "local").glob("*.yaml")):
        pod = yaml.safe_load(path.read_text())
        pods[pod["metadata"]["name"]] = pod
    return pods


@pytest.fixture(scope="module")
def demo_run() -> Iterator[tuple[subprocess.CompletedProcess[str], dict[str, dict[str, Any]], Path]]:
    """One full run, shared by the assertions below (a run costs seconds of two shared cores)."""
    path = Path(tempfile.mkdtemp(prefix="fgpu-lu-", dir="/tmp"))
    out = Path(tempfile.mkdtemp(prefix="fgpu-lu-out-")) / "outcome.json"
    result = local_up("--workdir", str(path), "--json", str(out))
    outcome = {p["name"]: p for p in json.loads(out.read_text())["pods"]} if out.exists() else {}
    yield result, outcome, path
    subprocess.run([str(SCRIPT), "--down", "--workdir", str(path)], capture_output=True, timeout=120, check=False)
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(out.parent, ignore_errors=True)


def test_the_demo_exits_zero_and_prints_the_table_and_the_inspect_view(demo_run: Any) -> None:
    result, outcome, _ = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    assert "NVIDIA_VISIBLE_DEVICES" in result.stdout and "MEMORY LIMIT ENV" in result.stdout
    assert "==> fgpuctl inspect" in result.stdout
    assert set(outcome) == set(demo_pods())


def test_the_pod_that_does_not_fit_stays_pending_and_says_why(demo_run: Any) -> None:
    _, outcome, _ = demo_run
    pending = outcome["does-not-fit"]
    assert pending["status"] == "Pending" and pending["gpus"] == [] and pending["sandboxId"] == ""
    assert "fgpu-local" in pending["reason"] and "GPU" in pending["reason"]


def test_every_other_pod_runs_to_completion(demo_run: Any) -> None:
    _, outcome, _ = demo_run
    statuses = {name: pod["status"] for name, pod in outcome.items() if name not in ("does-not-fit", "nvlink-4gpu")}
    assert set(statuses.values()) == {"Completed"}, outcome


def asks_for_gpus(container: dict[str, Any]) -> bool:
    """In the demo pods, a container's only resources are GPU resources."""
    resources = container.get("resources") or {}
    return bool(resources.get("limits") or resources.get("requests"))


def test_each_gpu_container_sees_exactly_the_gpus_it_was_given(demo_run: Any) -> None:
    _, outcome, _ = demo_run
    specs = demo_pods()
    for name, pod in outcome.items():
        if not pod["gpus"]:
            continue
        spec = specs[name]["spec"]
        asked = {c["name"]: asks_for_gpus(c) for c in spec.get("initContainers", []) + spec["containers"]}
        assert [c["name"] for c in pod["containers"]] == list(asked), name
        for container in pod["containers"]:
            visible = container["env"][names.NVIDIA_VISIBLE_DEVICES]
            if asked[container["name"]]:
                assert visible.split(",") == [g["uuid"] for g in pod["gpus"]], (name, container["name"])
            else:
                assert visible == names.NVIDIA_VISIBLE_DEVICES_VOID, (name, container["name"])


def test_fractional_shares_get_memory_limits_and_pack_onto_one_gpu(demo_run: Any) -> None:
    _, outcome, _ = demo_run
    half, small = outcome["half-gpu"], outcome["small-share"]
    assert [g["corePercent"] for g in half["gpus"]] == [50]
    assert [g["corePercent"] for g in small["gpus"]] == [30]
    assert small["gpus"][0]["uuid"] == half["gpus"][0]["uuid"], "binpack keeps the other GPUs whole"
    mib = small["gpus"][0]["memoryBytes"] // 2**20
    assert small["env"][f"{names.HAMI_MEMORY_LIMIT_PREFIX}0"] == f"{mib}m"
    assert small["env"][names.HAMI_SM_LIMIT] == "30"


def test_the_nvlink_pod_gets_four_whole_gpus_of_its_own(demo_run: Any) -> None:
    _, outcome, _ = demo_run
    nvlink = outcome["nvlink-4gpu"]
    uuids = {g["uuid"] for g in nvlink["gpus"]}
    assert len(uuids) == 4 and all(g["corePercent"] == 100 for g in nvlink["gpus"])
    others = {g["uuid"] for name, pod in outcome.items() if name != "nvlink-4gpu" for g in pod["gpus"]}
    assert not uuids & others


def test_vendor_resources_are_translated(demo_run: Any) -> None:
    _, outcome, _ = demo_run
    assert outcome["nvidia-whole"]["source"] == "nvidia"
    assert [g["corePercent"] for g in outcome["nvidia-whole"]["gpus"]] == [100]
    hami = outcome["hami-share"]
    assert hami["source"] == "hami"
    assert [(g["corePercent"], g["memoryBytes"]) for g in hami["gpus"]] == [(25, 10240 * 2**20)]
    assert hami["env"][f"{names.HAMI_MEMORY_LIMIT_PREFIX}0"] == "10240m"


def test_no_gpu_is_given_more_than_it_has(demo_run: Any) -> None:
    _, outcome, _ = demo_run
    core: dict[str, int] = {}
    for pod in outcome.values():
        for g in pod["gpus"]:
            core[g["uuid"]] = core.get(g["uuid"], 0) + g["corePercent"]
    assert core and max(core.values()) <= 100


def test_a_pod_without_gpus_on_a_cuda_image_sees_void(demo_run: Any) -> None:
    _, outcome, _ = demo_run
    pod = outcome["no-gpu-cuda-image"]
    assert pod["gpus"] == [] and pod["status"] == "Completed"
    assert pod["env"][names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID


def test_a_cpu_pod_through_fgpu_scheduler_gets_no_allocation_and_sees_void(demo_run: Any) -> None:
    _, outcome, _ = demo_run
    pod = outcome["cpu-through-fgpu-scheduler"]
    assert pod["gpus"] == [] and pod["status"] == "Completed", pod
    assert pod["env"][names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID


def test_the_sidecar_of_a_gpu_pod_sees_void_and_the_table_shows_it(demo_run: Any) -> None:
    result, outcome, _ = demo_run
    pod = outcome["gpu-with-sidecar"]
    assert pod["status"] == "Completed" and [g["corePercent"] for g in pod["gpus"]] == [50], pod
    env = {c["name"]: c["env"] for c in pod["containers"]}
    assert env["main"][names.NVIDIA_VISIBLE_DEVICES] == pod["gpus"][0]["uuid"]
    assert env["main"][names.FGPU_CORE_PERCENT] == "50"
    assert env["log-shipper"][names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID
    assert not [k for k in env["log-shipper"] if k.startswith(("FGPU_", "CUDA_DEVICE_", "CUDA_MPS_"))]
    # One row per container under the pod's row: the sidecar's own NVIDIA_VISIBLE_DEVICES is visible.
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["log-shipper", "void", "-", "exit", "0"] in rows, result.stdout
    assert ["cpu-through-fgpu-scheduler", "-", "void", "-", "Completed"] in rows, result.stdout


def runtime_ids(outcome: dict[str, dict[str, Any]]) -> set[str]:
    return {i for pod in outcome.values() for i in [pod["sandboxId"], *pod["containerIds"]] if i}


def test_the_demo_leaves_nothing_behind(demo_run: Any) -> None:
    _, outcome, path = demo_run
    assert not path.exists()
    assert runtime_ids(outcome)
    assert leftovers(path, runtime_ids(outcome)) == []


def test_keep_leaves_the_stack_running_until_down(workdir: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    kept = local_up("--keep", "--workdir", str(workdir), "--json", str(first))
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "grpcurl" in kept.stdout and "fgpuctl inspect --scheduler" in kept.stdout
    first_ids = runtime_ids({p["name"]: p for p in json.loads(first.read_text())["pods"]})
    assert (workdir / "scheduler.sock").exists()
    assert len(leftovers(workdir, first_ids)) > len(first_ids)  # the pods' sandboxes and our daemons
    # Running it again is idempotent: the kept stack is replaced, not doubled.
    again = local_up("--keep", "--workdir", str(workdir), "--json", str(second))
    assert again.returncode == 0, again.stdout + again.stderr
    assert [p for p in leftovers(workdir) if "fgpu-scheduler" in p] != []
    assert leftovers(workdir / "no-such-dir", first_ids) == [], "the first run's pods were not stopped"
    second_ids = runtime_ids({p["name"]: p for p in json.loads(second.read_text())["pods"]})
    down = local_up("--down", "--workdir", str(workdir))
    assert down.returncode == 0
    assert leftovers(workdir, first_ids | second_ids) == [] and not workdir.exists()


def test_ctrl_c_stops_everything_it_started(workdir: Path) -> None:
    proc = subprocess.Popen(
        [str(SCRIPT), "--workdir", str(workdir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        seen.append(line)
        if "fgpu-runtime-proxy" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + rest
    assert leftovers(workdir) == []
