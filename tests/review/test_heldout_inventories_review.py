"""Held-out GPU inventories against fgpu-agent: what it reports, what its hook decides, whether it survives.

Each inventory here (tests/review/inventories/, or an example one with one NVML call
made to fail the way a real driver does) is one the authors' tests never tried. The
agent runs its production path, NVMLWorker -> NodeState -> the hook's `decide` and the
metrics, on the fake NVML, with the poll iterations driven one at a time on a clock the
test moves, so nothing sleeps. Each test was written failing (strict xfail) for a defect found by this review, since fixed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.cgroups import PidResolver
from agent.checkpoint import CheckpointReader
from agent.fakenvml import FakeHandle, FakeNVML
from agent.fakenvml_inventory import Inventory, load_inventory
from agent.health import HealthTracker
from agent.hook import HookDecision, HookRequest, HookSettings, decide
from agent.isolation.registry import IsolationPaths
from agent.metrics import AgentMetrics
from agent.nodestate import NodeState
from agent.nvmlworker import NVMLWorker
from agent.pcitopology import InventoryTopology, PciTopologySource, SysfsTopology
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare
from apis.devices import GPUInfo, NodeDevices, from_device_object, to_device_object
from apis.signing import allocation_annotations
from tests.agent.helpers import T4
from tests.signing_keys import signing_key, verifying

HERE = os.path.dirname(os.path.abspath(__file__))
MINORS_REVERSED = os.path.join(HERE, "inventories", "a100-2x-minors-reversed.yaml")
VMD_DOMAIN = os.path.join(HERE, "inventories", "l40s-2x-vmd-domain.yaml")
T4_3X = os.path.join(HERE, "inventories", "t4-3x-pcie.yaml")

NODE = "heldout-node"
KEY = signing_key("heldout-inventories-review")
POLL_S = 1.0
DISCOVERY_S = 10.0
QUIET_S = 300.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    """One agent's NVML side without its threads: each `poll()` is one iteration of the poll loop."""

    nvml: FakeNVML
    inventory: Inventory
    state: NodeState
    worker: NVMLWorker
    clock: Clock
    metrics: AgentMetrics

    def poll(self, *, after_s: float = POLL_S) -> NodeDevices:
        self.clock.now += after_s
        self.worker.run_once()
        return self.state.devices()

    def rediscover(self) -> NodeDevices:
        """The next iteration that rediscovers (the discovery interval has passed)."""
        return self.poll(after_s=DISCOVERY_S + POLL_S)


def _rig(
    path: str,
    *,
    nvml_class: type[FakeNVML] = FakeNVML,
    topology: Callable[[Inventory], PciTopologySource] = InventoryTopology,
) -> Rig:
    inventory = load_inventory(path)
    clock = Clock()
    nvml = nvml_class(inventory, clock=clock, usage_file="")
    metrics = AgentMetrics()
    state = NodeState(node_name=NODE, health=HealthTracker(quiet_period_s=QUIET_S), metrics=metrics)
    worker = NVMLWorker(
        nvml, state=state, topology=topology(inventory), resolver=PidResolver(proc_root="/nonexistent-proc"),
        checkpoint=CheckpointReader("/nonexistent-checkpoint"), external_resources=(), metrics=metrics,
        poll_interval_s=POLL_S, discovery_interval_s=DISCOVERY_S, watch_xids=False, clock=clock,
    )
    rig = Rig(nvml, inventory, state, worker, clock, metrics)
    rig.worker.run_once()
    return rig


def _gpu(devices: NodeDevices, uuid: str) -> GPUInfo | None:
    return next((g for g in devices.gpus if g.uuid == uuid), None)


def _whole_gpu_pod(devices: NodeDevices, uuid: str, *, pod_uid: str) -> HookDecision:
    """The hook's decision for a new pod the scheduler gave all of GPU `uuid`, signed for this node."""
    gpu = _gpu(devices, uuid)
    assert gpu is not None, f"{uuid} is not in the report at all"
    share = GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=100, memory_bytes=0, memory_ratio_percent=100,
        containers=(ContainerShare("main", 100, 0, 100),),
    )
    annotations = allocation_annotations(KEY, pod_uid=pod_uid, node_name=NODE, allocation=Allocation(gpus=(share,)))
    request = HookRequest(
        pod_uid=pod_uid, pod_namespace="ml", pod_name=f"trainer-{pod_uid}", container_name="main",
        annotations=annotations,
    )
    settings = HookSettings(
        node_name=NODE, key=verifying(KEY), isolation=names.ISOLATION_HAMI_CORE, paths=IsolationPaths()
    )
    return decide(request, devices=devices, settings=settings)


def _failing(index: int, call: str, error: str) -> type[FakeNVML]:
    """The fake NVML with `call` on GPU `index` (not its MIG devices) raising NVMLError_<error>."""

    def broken(self: FakeNVML, *args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else None
        if first == index or (isinstance(first, FakeHandle) and first.gpu_index == index and first.mig_index < 0):
            raise getattr(pynvml, f"NVMLError_{error}")()
        return getattr(FakeNVML, call)(self, *args, **kwargs)

    return type(f"FakeNVML_{call}_{error}", (FakeNVML,), {call: broken})


class _LostButNamed(FakeNVML):
    """A GPU that fell off the bus as the driver often shows it: its handle and UUID (cached by
    NVML) still answer, every other call on it raises GpuIsLost."""

    lost_index = -1

    def _gpu(self, name: str, handle: FakeHandle) -> Any:
        if (
            isinstance(handle, FakeHandle) and handle.gpu_index == self.lost_index
            and name not in ("nvmlDeviceGetUUID",)
        ):
            self._checked(name)
            raise pynvml.NVMLError_GpuIsLost()
        return super()._gpu(name, handle)


def _driver_unloaded(rig: Rig) -> None:
    """The driver goes away under the agent (`rmmod nvidia`, a driver upgrade): NVML calls fail."""

    def gone() -> int:
        raise pynvml.NVMLError_DriverNotLoaded()

    rig.nvml.nvmlDeviceGetCount = gone  # type: ignore[method-assign]
    rig.nvml.set_init_error("DriverNotLoaded")


def _driver_back(rig: Rig) -> None:
    del rig.nvml.nvmlDeviceGetCount
    rig.nvml.set_init_error("")


# --- one GPU's NVML call fails in a way that is not "GPU gone" ---------------------------------------


@pytest.mark.parametrize(("call", "error"), [
    # Unified-memory boards (GB10 / DGX Spark) answer memory info NotSupported.
    ("nvmlDeviceGetMemoryInfo", "NotSupported"),
    # A GPU whose /dev/nvidiaN the agent's device cgroup does not allow.
    ("nvmlDeviceGetHandleByIndex", "NoPermission"),
])
def test_one_gpu_that_nvml_cannot_read_leaves_the_other_gpus_reported(call: str, error: str) -> None:
    rig = _rig(T4_3X, nvml_class=_failing(1, call, error))
    devices = rig.state.devices()
    healthy = [g.uuid for g in devices.gpus if g.healthy]
    assert healthy == [rig.inventory.gpus[0].uuid, rig.inventory.gpus[2].uuid], (
        f"GPUs 0 and 2 answer every call, yet the report has {healthy} (discoveryError={devices.discovery_error!r})"
    )
    assert not devices.discovery_error
    broken = _gpu(devices, rig.inventory.gpus[1].uuid)
    assert broken is None or (not broken.healthy and error in broken.health_reason)


# --- a GPU lost after discovery ------------------------------------------------------------------------


def test_a_gpu_lost_after_discovery_keeps_its_minor_in_the_device_object() -> None:
    rig = _rig(MINORS_REVERSED, nvml_class=_LostButNamed)
    lost = rig.inventory.gpus[0]
    assert [g.minor for g in rig.state.devices().gpus] == [5, 0]
    rig.nvml.lost_index = 0  # type: ignore[attr-defined]
    devices = rig.rediscover()
    reported = _gpu(devices, lost.uuid)
    assert reported is not None and not reported.healthy
    stored = from_device_object(to_device_object(devices, node_uid="node-uid"))
    minors = [g.minor for g in stored.gpus]
    assert len(set(minors)) == len(minors), f"the Device object lists minors {minors}: /dev/nvidia0 twice"
    assert (reported.minor, reported.memory_bytes) == (lost.minor, lost.memory_bytes)


def test_a_gpu_that_vanished_at_a_rediscovery_serves_its_quiet_period_when_it_returns() -> None:
    rig = _rig(T4_3X)
    gone = rig.inventory.gpus[1].uuid
    rig.nvml.set_lost(1, True)  # falls off the bus just before an iteration that rediscovers
    devices = rig.rediscover()
    missing = _gpu(devices, gone)
    assert missing is not None and not missing.healthy, "a vanished GPU stays reported, unhealthy"
    assert _whole_gpu_pod(devices, gone, pod_uid="pod-while-gone").rejection
    rig.nvml.set_lost(1, False)  # answers again 22 s later, a fraction of the 300 s quiet period
    devices = rig.rediscover()
    back = _gpu(devices, gone)
    assert back is not None and not back.healthy, (
        f"GPU {gone} was lost {DISCOVERY_S * 2 + 2 * POLL_S:g}s ago and is healthy again at its first check; "
        f"healthQuietPeriod is {QUIET_S:g}s"
    )
    assert _whole_gpu_pod(devices, gone, pod_uid="pod-after-return").rejection


def test_a_lost_gpu_stays_unhealthy_across_a_driver_reload() -> None:
    rig = _rig(T4_3X)
    lost = rig.inventory.gpus[2].uuid
    rig.nvml.set_lost(2, True)
    devices = rig.poll()
    assert (g := _gpu(devices, lost)) is not None and not g.healthy  # the usage check saw it
    _driver_unloaded(rig)
    assert rig.rediscover().discovery_error
    _driver_back(rig)
    rig.poll(after_s=2 * POLL_S)  # nvmlInit again, after the backoff
    devices = rig.rediscover()
    assert not devices.discovery_error
    kept = _gpu(devices, lost)
    assert kept is not None and not kept.healthy, (
        f"GPU {lost} is still lost, but after the driver reload the report has only "
        f"{[g.uuid for g in devices.gpus]}"
    )
    rig.nvml.set_lost(2, False)
    devices = rig.rediscover()
    back = _gpu(devices, lost)
    assert back is not None and not back.healthy, "back within the quiet period, yet healthy"
    assert _whole_gpu_pod(devices, lost, pod_uid="pod-after-reload").rejection


# --- metrics of GPUs no longer reported --------------------------------------------------------------


def test_per_gpu_series_go_when_nvml_stops_answering() -> None:
    rig = _rig(T4)
    rig.poll()
    text = rig.metrics.exposition().decode()
    uuid = rig.inventory.gpus[0].uuid
    assert f'fgpu_agent_gpu_sm_utilization_percent{{uuid="{uuid}"}} 63.0' in text
    _driver_unloaded(rig)
    devices = rig.rediscover()
    rig.poll()
    assert devices.discovery_error and not devices.gpus
    text = rig.metrics.exposition().decode()
    assert "fgpu_agent_nvml_up 0.0" in text
    stale = [line for line in text.splitlines() if not line.startswith("#") and "GPU-" in line]
    assert not stale, "series of GPUs the agent no longer reports:\n" + "\n".join(stale)


# --- PCI bus ids in a domain above 0xffff --------------------------------------------------------------


def _sysfs(root: Path, devices: dict[str, tuple[str, int]]) -> str:
    """A sysfs tree as Linux lays it out: bus/pci/devices/<id> -> devices/<root>/<bridge>/<id>."""
    for sysfs_id, (pcie_root, numa) in devices.items():
        bridge = root / "devices" / pcie_root / f"{pcie_root[3:]}:01.0"  # the root port
        device = bridge / sysfs_id
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa}\n")
        link_dir = root / "bus" / "pci" / "devices"
        link_dir.mkdir(parents=True, exist_ok=True)
        (link_dir / sysfs_id).symlink_to(device)
    return str(root)


def test_a_gpu_in_a_vmd_domain_gets_its_own_sysfs_placement(tmp_path: Path) -> None:
    # Linux names the VMD device 10000:01:00.0 (the domain printed %04x); NVML 00010000:01:00.0.
    root = _sysfs(tmp_path, {"10000:01:00.0": ("pci10000:00", 1), "0000:01:00.0": ("pci0000:00", 0)})
    rig = _rig(VMD_DOMAIN, topology=lambda _inventory: SysfsTopology(root=root))
    placed = {g.topology.bus_id: (g.topology.numa_node, g.topology.pcie_root) for g in rig.state.devices().gpus}
    assert placed == {"00010000:01:00.0": (1, "pci10000:00"), "00000000:01:00.0": (0, "pci0000:00")}


def test_a_pod_on_two_pci_domains_gets_its_limits_in_cuda_order() -> None:
    rig = _rig(VMD_DOMAIN)
    devices = rig.state.devices()
    vmd, low = rig.inventory.gpus  # 00010000:01:00.0 and 00000000:01:00.0
    gib = 2**30
    shares = tuple(
        GPUShare(
            minor=g.minor, uuid=g.uuid, core_percent=core, memory_bytes=memory * gib, memory_ratio_percent=0,
            containers=(ContainerShare("main", core, memory * gib, 0),),
        )
        for g, core, memory in ((vmd, 30, 3), (low, 50, 5))
    )
    annotations = allocation_annotations(KEY, pod_uid="two-domains", node_name=NODE, allocation=Allocation(gpus=shares))
    decision = decide(
        HookRequest(pod_uid="two-domains", pod_namespace="ml", pod_name="p", container_name="main",
                    annotations=annotations),
        devices=devices,
        settings=HookSettings(node_name=NODE, key=verifying(KEY), isolation=names.ISOLATION_HAMI_CORE,
                              paths=IsolationPaths()),
    )
    assert decision.edits is not None, decision.rejection
    env = dict(decision.edits.envs)
    # CUDA_DEVICE_ORDER=PCI_BUS_ID: domain 0 comes before domain 0x10000, so CUDA's ordinal 0 is `low`
    # (5 GiB, 50%) and ordinal 1 the VMD card (3 GiB, 30%), whatever order the allocation lists them in.
    limits = {i: (env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"], env[f"CUDA_DEVICE_SM_LIMIT_{i}"]) for i in (0, 1)}
    assert limits == {0: ("5120m", "50"), 1: ("3072m", "30")}, env[names.NVIDIA_VISIBLE_DEVICES]
