"""GPUs that vanish, come back, or stop being readable, through the poll loop driven one iteration at a time."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pynvml

from agent.cgroups import PidResolver
from agent.checkpoint import CheckpointReader
from agent.discovery import Discovery
from agent.fakenvml import FakeHandle, FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.health import HealthTracker
from agent.metrics import AgentMetrics
from agent.nodestate import LOST_REASON, NodeState
from agent.nvmlworker import NVMLWorker
from agent.pcitopology import InventoryTopology
from agent.usage import GPUUsage
from apis.devices import GPUInfo, NodeDevices
from tests.agent.helpers import T4

QUIET_S = 300.0
DISCOVERY_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class MemoryInfoRefused(FakeNVML):
    """GPU 1 answers nvmlDeviceGetMemoryInfo NotSupported while `refused` is set (a unified-memory board)."""

    refused = True

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        if self.refused and handle.gpu_index == 1:
            raise pynvml.NVMLError_NotSupported()
        return super().nvmlDeviceGetMemoryInfo(handle, version)


class Node:
    def __init__(self, nvml_class: type[FakeNVML] = FakeNVML) -> None:
        inventory = load_inventory(T4)
        self.clock = Clock()
        self.nvml = nvml_class(inventory, clock=self.clock)
        self.metrics = AgentMetrics()
        self.state = NodeState(node_name="n", health=HealthTracker(quiet_period_s=QUIET_S), metrics=self.metrics)
        self.worker = NVMLWorker(
            self.nvml, state=self.state, topology=InventoryTopology(inventory),
            resolver=PidResolver(proc_root="/nonexistent"), checkpoint=CheckpointReader("/nonexistent"),
            external_resources=(), metrics=self.metrics, poll_interval_s=1.0, discovery_interval_s=DISCOVERY_S,
            watch_xids=False, clock=self.clock,
        )
        self.uuids = [g.uuid for g in inventory.gpus]
        self.worker.run_once()

    def poll(self, after_s: float = 1.0) -> NodeDevices:
        self.clock.now += after_s
        self.worker.run_once()
        return self.state.devices()

    def health(self, index: int) -> tuple[bool, str] | None:
        gpu = next((g for g in self.state.devices().gpus if g.uuid == self.uuids[index]), None)
        return None if gpu is None else (gpu.healthy, gpu.health_reason)


def _driver_unloaded(nvml: FakeNVML) -> None:
    """`rmmod nvidia` under the agent: discovery fails, and so does nvmlInit until the driver is back."""

    def gone() -> int:
        raise pynvml.NVMLError_DriverNotLoaded()

    nvml.nvmlDeviceGetCount = gone  # type: ignore[method-assign]
    nvml.set_init_error("DriverNotLoaded")


def _driver_back(nvml: FakeNVML) -> None:
    del nvml.nvmlDeviceGetCount
    nvml.set_init_error("")


def test_a_vanished_gpu_fails_its_check_at_every_poll_so_its_quiet_period_starts_at_its_return() -> None:
    node = Node()
    node.nvml.set_lost(3, True)
    node.poll(DISCOVERY_S)  # the rediscovery does not find it
    assert node.health(3) == (False, LOST_REASON)
    for _ in range(8):  # away for longer than the quiet period
        node.poll(DISCOVERY_S)
    assert node.state.vanished() == (node.uuids[3],)
    node.nvml.set_lost(3, False)
    node.poll(DISCOVERY_S)
    assert node.health(3) == (False, LOST_REASON), "back after 8 minutes away, healthy at its first check"
    node.poll(QUIET_S - DISCOVERY_S + 1)
    assert node.health(3) == (True, "")


def test_gpus_that_vanished_before_nvml_went_down_are_still_missed_after_it_answers_again() -> None:
    node = Node()
    node.nvml.set_lost(2, True)
    node.nvml.set_lost(3, True)
    node.poll(DISCOVERY_S)
    _driver_unloaded(node.nvml)
    devices = node.poll(DISCOVERY_S)
    assert devices.discovery_error and devices.gpus == () and node.state.usage() == ()
    for _ in range(6):  # NVML down for longer than the quiet period
        node.poll(DISCOVERY_S)
    _driver_back(node.nvml)
    node.nvml.set_lost(3, False)  # GPU 3 comes back with the driver, GPU 2 does not
    node.poll(DISCOVERY_S)
    assert [g.uuid for g in node.state.devices().gpus] == node.uuids  # the lost one is still reported
    assert node.health(2) == (False, LOST_REASON)
    assert node.health(3) == (False, LOST_REASON), "missed until NVML went away, healthy as soon as it is back"
    node.nvml.set_lost(2, False)
    node.poll(DISCOVERY_S)
    assert node.health(2) == (False, LOST_REASON), "the quiet period runs from its return"


def test_a_gpu_discovery_cannot_read_stays_unhealthy_and_serves_the_quiet_period_once_readable() -> None:
    node = Node(MemoryInfoRefused)
    healthy, reason = node.health(1) or (True, "")
    assert not healthy and reason.startswith("unreadable: NVMLError_NotSupported")
    assert [node.health(i) for i in (0, 2, 3)] == [(True, "")] * 3
    node.poll(QUIET_S + 1)
    assert node.health(1) == (False, reason)  # no usage check passing in between makes it healthy
    node.nvml.refused = False  # type: ignore[attr-defined]
    node.poll(DISCOVERY_S)
    assert node.health(1) == (False, reason)
    node.poll(QUIET_S)
    assert node.health(1) == (True, "")


def _gpu(uuid: str, minor: int) -> GPUInfo:
    return GPUInfo(uuid=uuid, minor=minor, index=minor, model="Tesla T4", model_label="T4", memory_bytes=16 << 30)


def _found(*gpus: GPUInfo) -> Discovery:
    return Discovery(devices=NodeDevices(node_name="n", gpus=gpus))


def test_a_vanished_gpu_whose_minor_now_names_another_gpu_is_not_reported_twice_on_it() -> None:
    state = NodeState(node_name="n", health=HealthTracker(), metrics=AgentMetrics())
    state.set_discovery(_found(_gpu("GPU-a", 0), _gpu("GPU-b", 1)))
    state.set_discovery(_found(replace(_gpu("GPU-b", 0), index=0)))  # after a reload GPU-b is /dev/nvidia0
    assert [(g.uuid, g.minor) for g in state.devices().gpus] == [("GPU-b", 0)]
    assert state.vanished() == ("GPU-a",)
    state.set_discovery(_found(_gpu("GPU-a", 0), _gpu("GPU-b", 1)))
    assert state.vanished() == ()


def test_nvml_going_down_clears_the_usage_and_every_per_gpu_series() -> None:
    metrics = AgentMetrics()
    state = NodeState(node_name="n", health=HealthTracker(), metrics=metrics)
    state.set_discovery(_found(_gpu("GPU-a", 0)))
    state.set_usage((GPUUsage(uuid="GPU-a", memory_used_bytes=5),))
    metrics.observe_usage(state.usage())
    assert metrics.registry.get_sample_value("fgpu_agent_gpu_memory_used_bytes", {"uuid": "GPU-a"}) == 5
    state.set_discovery_error("NVML discovery failed: NVMLError_DriverNotLoaded")
    assert state.usage() == ()
    assert "GPU-a" not in metrics.exposition().decode()
    state.set_discovery(_found(_gpu("GPU-a", 0)))
    assert state.known_gpus().keys() == {"GPU-a"}
