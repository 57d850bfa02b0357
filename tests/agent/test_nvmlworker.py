"""The NVML poll loop and Xid watcher, over the fake NVML: failures at start, Xids, lost GPUs, recovery."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from agent.cgroups import PidResolver
from agent.checkpoint import CheckpointEntry, CheckpointReader
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.health import HealthTracker
from agent.metrics import AgentMetrics
from agent.nodestate import NodeState
from agent.nvmlworker import NVMLWorker
from agent.pcitopology import InventoryTopology
from apis import names
from apis.devices import NodeDevices
from tests.agent.helpers import T4, data_file
from tests.waiting import wait_until as _wait


class Node:
    def __init__(
        self,
        *,
        quiet_period_s: float = 0.3,
        init_error: str = "",
        checkpoint: str = "/nonexistent",
        reader: CheckpointReader | None = None,
    ) -> None:
        inventory = load_inventory(T4)
        self.nvml = FakeNVML(inventory)
        self.nvml.set_init_error(init_error)
        self.metrics = AgentMetrics()
        self.state = NodeState(node_name="n", health=HealthTracker(quiet_period_s=quiet_period_s), metrics=self.metrics)
        self.changes: list[NodeDevices] = []
        self.state.on_change(self.changes.append)
        self.worker = NVMLWorker(
            self.nvml,
            state=self.state,
            topology=InventoryTopology(inventory),
            resolver=PidResolver(proc_root="/nonexistent"),
            checkpoint=reader or CheckpointReader(checkpoint),
            external_resources=(names.NVIDIA_GPU,),
            metrics=self.metrics,
            poll_interval_s=0.05,
            discovery_interval_s=0.5,
            retry_max_s=0.1,
        )

    def devices(self) -> NodeDevices:
        return self.state.devices()

    def gpu_health(self, index: int) -> tuple[bool, str]:
        gpu = next(g for g in self.devices().gpus if g.index == index)
        return gpu.healthy, gpu.health_reason


@pytest.fixture
def node() -> Iterator[Node]:
    n = Node()
    n.worker.start()
    _wait(lambda: len(n.devices().gpus) == 4)
    yield n
    n.worker.stop(2)


def test_nvml_failing_at_start_is_a_report_with_no_gpus_and_the_reason_then_recovers() -> None:
    n = Node(init_error="LibraryNotFound")
    n.worker.start()
    try:
        _wait(lambda: n.worker.cycles >= 3)
        devices = n.devices()
        assert devices.gpus == ()
        assert "NVMLError_LibraryNotFound" in devices.discovery_error
        assert "driver" in devices.discovery_error  # says what to check
        n.nvml.set_init_error("")
        _wait(lambda: len(n.devices().gpus) == 4)
        assert n.devices().discovery_error == ""
    finally:
        n.worker.stop(2)


def test_an_xid_turns_the_gpu_unhealthy_and_it_recovers_after_the_quiet_period(node: Node) -> None:
    node.nvml.inject_xid(2, 48)
    _wait(lambda: node.gpu_health(2) == (False, "Xid48"))
    assert node.gpu_health(1) == (True, "")
    _wait(lambda: node.gpu_health(2) == (True, ""))
    transitions = node.metrics.health_transitions
    assert transitions.labels(node.devices().gpus[2].uuid, "unhealthy", "Xid48")._value.get() == 1
    assert node.metrics.xid_events.labels(node.devices().gpus[2].uuid, "48")._value.get() == 1


def test_an_application_xid_is_counted_but_changes_no_health(node: Node) -> None:
    node.nvml.inject_xid(0, 13)
    uuid = node.devices().gpus[0].uuid
    _wait(lambda: node.metrics.xid_events.labels(uuid, "13")._value.get() == 1)
    time.sleep(0.2)
    assert node.gpu_health(0) == (True, "")


def test_a_gpu_falling_off_the_bus_stays_unhealthy_until_it_answers_again(node: Node) -> None:
    node.nvml.inject_xid(1, 79)
    _wait(lambda: not node.gpu_health(1)[0])
    time.sleep(0.6)  # longer than the quiet period: the failing checks keep it down
    healthy, reason = node.gpu_health(1)
    assert not healthy and reason.startswith(("Xid79", "lost"))
    node.nvml.set_lost(1, False)
    _wait(lambda: node.gpu_health(1) == (True, ""))


def test_a_gpu_lost_between_discoveries_is_still_reported_unhealthy(node: Node) -> None:
    uuid = node.devices().gpus[3].uuid
    node.nvml.set_lost(3, True)
    _wait(lambda: any(g.uuid == uuid and not g.healthy for g in node.devices().gpus))
    time.sleep(0.6)  # past a rediscovery that cannot see the GPU at all
    assert any(g.uuid == uuid and not g.healthy for g in node.devices().gpus)


def test_every_change_is_published_to_listeners(node: Node) -> None:
    before = len(node.changes)
    node.nvml.inject_xid(0, 94)
    _wait(lambda: len(node.changes) > before)
    assert not node.changes[-1].gpus[0].healthy


def test_gpus_held_through_the_kubelet_checkpoint_are_attached_to_the_report(tmp_path: object) -> None:
    import shutil

    path = f"{tmp_path}/kubelet_internal_checkpoint"
    shutil.copy(data_file("kubelet_internal_checkpoint.pre-1.20"), path)  # holds GPU index 2
    n = Node(checkpoint=path)
    n.worker.start()
    try:
        _wait(lambda: bool(n.devices().external_holders))
        assert [h.gpu_uuid for h in n.devices().external_holders] == [n.devices().gpus[2].uuid]
    finally:
        n.worker.stop(2)


def test_nothing_counts_as_ready_before_nvml_was_tried_once() -> None:
    n = Node(init_error="DriverNotLoaded")
    assert not n.state.ready()  # reporters wait: "no GPUs" now would only be "not looked yet"
    n.worker.run_once()
    assert n.state.ready() and n.devices().gpus == ()


class BrokenCheckpointReader(CheckpointReader):
    """Raises what no handler expects (a bug's way of failing) while `broken` is set."""

    broken = True

    def entries(self) -> tuple[CheckpointEntry, ...]:
        if self.broken:
            raise ValueError("unexpected checkpoint layout")
        return super().entries()


def test_an_unexpected_error_in_a_cycle_is_logged_counted_and_polling_goes_on(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    path = f"{tmp_path}/kubelet_internal_checkpoint"
    shutil.copy(data_file("kubelet_internal_checkpoint.pre-1.20"), path)  # holds GPU index 2
    reader = BrokenCheckpointReader(path)
    n = Node(reader=reader)
    n.worker.start()
    try:
        _wait(lambda: n.metrics.poll_errors._value.get() >= 3)
        assert n.worker._thread.is_alive()
        assert any(r.exc_info and "unexpected checkpoint layout" in str(r.exc_info[1]) for r in caplog.records)
        reader.broken = False
        # The loop still runs: what the next cycles read reaches the report.
        _wait(lambda: bool(n.devices().external_holders))
        assert [h.gpu_uuid for h in n.devices().external_holders] == [n.devices().gpus[2].uuid]
    finally:
        n.worker.stop(2)
