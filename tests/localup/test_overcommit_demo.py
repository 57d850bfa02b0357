"""`hack/local-up.sh --overcommit-demo` end to end, as the README runs it: the API double, fgpu-scheduler,
fgpu-agent in Kubernetes mode with its overcommit settings, the proxy, real containerd and the soak's
kubelet-like driver. A burstable pod is admitted beyond what the guaranteed pod leaves free, its
container is capped at its limit, and scripted GPU memory growth gets it deleted by the agent, while the
guaranteed pod keeps running."""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from apis import names
from tests.localup.manifests import REPO
from tests.localup.test_local_up import SCRIPT, leftovers, local_up

MIB = 2**20


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fgpu-oc-", dir="/tmp"))
    yield path
    subprocess.run([str(SCRIPT), "--down", "--workdir", str(path)], capture_output=True, timeout=120, check=False)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.containerd
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="local-up needs root for containerd and runc")
@pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd is not installed")
def test_a_burstable_pod_admitted_beyond_the_guaranteed_capacity_is_evicted_under_pressure(workdir: Path) -> None:
    out = workdir.with_suffix(".json")
    result = local_up("--overcommit-demo", "--workdir", str(workdir), "--json", str(out), timeout_s=180)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    out.unlink()
    assert data["ok"] and data["problems"] == []
    guaranteed, burstable = data["pods"]["serving-guaranteed"], data["pods"]["batch-burstable"]
    assert (guaranteed["tier"], burstable["tier"]) == ("guaranteed", "burstable")
    assert guaranteed["gpu"] == burstable["gpu"] == data["gpu_uuid"]
    # Admitted beyond the guaranteed capacity: its limit is more than the guaranteed pod leaves free,
    # within the node's ratio of it; what the scheduler reserved (its request) fits.
    free = data["guaranteed_free_bytes"]
    assert data["ratio"] == "2"
    assert burstable["request_bytes"] <= free < burstable["limit_bytes"] <= 2 * free
    # Each container's own environment caps memory: the burstable at its limit, the guaranteed at its request.
    assert burstable["env"][f"{names.HAMI_MEMORY_LIMIT_PREFIX}0"] == f"{burstable['limit_bytes'] // MIB}m"
    assert guaranteed["env"][f"{names.HAMI_MEMORY_LIMIT_PREFIX}0"] == f"{guaranteed['request_bytes'] // MIB}m"
    assert burstable["env"][names.HAMI_SM_LIMIT] == str(burstable["limit_core"])
    # Steady use below the mark evicted nobody; the growth past it got the burstable pod (and only it)
    # deleted by the agent, with an Event and the metric; the guaranteed pod still runs.
    assert data["steady_used_bytes"] < data["high_water"] * data["gpu_bytes"] <= data["pressure_used_bytes"]
    assert burstable["end"] == "Evicted" and burstable["evicted_after_s"] >= 1.0  # not before pressureGrace
    assert guaranteed["end"] == "Running" and guaranteed["evicted_after_s"] is None
    assert [e["pod"] for e in data["events"]] == ["batch-burstable"]
    assert "high-water mark" in data["events"][0]["message"]
    assert data["metric_evicted"] == 1.0
    assert "admitted beyond the guaranteed capacity" in result.stdout
    assert "Event BurstableEvicted on batch-burstable" in result.stdout
    assert leftovers(workdir) == []
    # No process left in the pods' cgroups, and the cgroups themselves removed.
    assert [d for p in (guaranteed, burstable) for d in glob.glob(f"/sys/fs/cgroup/*/kubepods/burstable/pod{p['uid']}")] == []


def test_the_fake_nvml_follows_its_usage_file_and_keeps_its_usage_when_the_file_is_bad(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The demo's hand on GPU memory use: the agent's fake NVML re-reads the file whenever it changes."""
    usage = tmp_path / "usage.yaml"
    nvml = FakeNVML(load_inventory(str(REPO / "examples" / "inventories" / "t4-4x-pcie.yaml")), usage_file=str(usage))
    nvml.nvmlInit()
    gpu = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetMemoryInfo(gpu).used == 0  # no file yet: the inventory's usage
    usage.write_text("- {gpu: 1, memoryUsed: 6Gi, processes: [{pid: 4242, usedMemory: 5Gi}]}\n")
    assert nvml.nvmlDeviceGetMemoryInfo(gpu).used == 6 * 2**30
    assert [(p.pid, p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(gpu)] == [(4242, 5 * 2**30)]
    with caplog.at_level(logging.ERROR, logger="agent.fakenvml"):
        usage.write_text("- {gpu: 9, memoryUsed: 1Gi}\n")
        assert nvml.nvmlDeviceGetMemoryInfo(gpu).used == 6 * 2**30
    assert "[0].gpu: 9 is not a GPU index here; write 0 to 3" in caplog.text
