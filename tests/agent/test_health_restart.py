"""A GPU that failed stays failed when the agent restarts (agent/health_record.py).

Xids are events: a new agent process never hears the ones its predecessor did. Found by the
chaos soak (seed 20261201): a GPU with Xid 79, then a kill -9 of the agent, and the next
agent reported the GPU healthy and the scheduler bound a pod to it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agent.config import AgentConfig, health_record_path
from agent.daemon import Agent
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.health import HealthTracker
from agent.health_record import HealthRecord, read_boot_id
from agent.pcitopology import InventoryTopology
from agent.schedclient import SchedulerReporter
from apis.devices import NodeDevices, from_proto
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.agent.helpers import T4
from tests.signing_keys import signing_key, write_verifying_keys
from tests.waiting import wait_until as _wait

NODE = "gpu-node-health"


class _Scheduler(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.reports: list[NodeDevices] = []
        self.lock = threading.Lock()

    def ReportDevices(
        self, request: scheduler_pb2.ReportDevicesRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.ReportDevicesResponse:
        with self.lock:
            self.reports.append(from_proto(request.report))
        return scheduler_pb2.ReportDevicesResponse()

    def gpus(self) -> list[list[tuple[str, bool, str]]]:
        with self.lock:
            return [[(g.uuid, g.healthy, g.health_reason) for g in r.gpus] for r in self.reports if r.gpus]



class _Node:
    """One node's directories; each `agent()` is a new agent process's worth of state."""

    def __init__(self, tmp: str, scheduler_socket: str) -> None:
        self.tmp = tmp
        self.scheduler_socket = scheduler_socket
        self.keys = write_verifying_keys(os.path.join(tmp, "keys"), signing_key("health-restart-test"))
        self.set_boot("boot-1")

    def set_boot(self, boot_id: str) -> None:
        path = Path(self.tmp, "proc/sys/kernel/random/boot_id")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(boot_id + "\n")

    def config(self, quiet_s: float) -> AgentConfig:
        return AgentConfig(
            node_name=NODE, hook_listen=f"unix://{self.tmp}/run/hooks.sock", verifying_keys=self.keys,
            scheduler=f"unix://{self.scheduler_socket}", metrics_listen="", poll_interval_s=0.05,
            discovery_interval_s=1.0, report_resync_s=0.3, health_quiet_period_s=quiet_s,
            checkpoint_path=os.path.join(self.tmp, "no-checkpoint"), proc_root=os.path.join(self.tmp, "proc"),
        )

    def agent(self, quiet_s: float) -> tuple[Agent, FakeNVML]:
        os.makedirs(os.path.join(self.tmp, "run"), mode=0o755, exist_ok=True)
        inventory = load_inventory(T4)
        nvml = FakeNVML(inventory)
        config = self.config(quiet_s)
        agent = Agent(config, node_name=NODE, nvml=nvml, topology=InventoryTopology(inventory),
                      scheduler=SchedulerReporter(config.scheduler))
        agent.start()
        return agent, nvml


@pytest.fixture
def node() -> Iterator[tuple[_Node, _Scheduler]]:
    tmp = tempfile.mkdtemp(prefix="fgpu-health-")
    socket = os.path.join(tmp, "sched.sock")
    scheduler = _Scheduler()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield _Node(tmp, socket), scheduler
    finally:
        server.stop(0).wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _fail_gpu0_then_stop(node: _Node, scheduler: _Scheduler) -> str:
    agent, nvml = node.agent(quiet_s=30.0)
    try:
        _wait(lambda: bool(scheduler.gpus()))
        uuid = scheduler.gpus()[-1][0][0]
        nvml.inject_xid(0, 48)
        _wait(lambda: scheduler.gpus()[-1][0] == (uuid, False, "Xid48"))
    finally:
        agent.stop(2)
    return uuid


def test_a_gpu_that_failed_is_reported_unhealthy_from_the_first_report_of_the_next_agent(
    node: tuple[_Node, _Scheduler],
) -> None:
    n, scheduler = node
    uuid = _fail_gpu0_then_stop(n, scheduler)
    before = len(scheduler.reports)
    agent, _ = n.agent(quiet_s=30.0)  # a new process: a fresh NVML that never delivers that Xid again
    try:
        _wait(lambda: len(scheduler.gpus()) > before + 2)
        after = scheduler.gpus()[before:]
        assert all(r[0] == (uuid, False, "Xid48") for r in after), after
        assert all(healthy for r in after for (_, healthy, _) in r[1:])
    finally:
        agent.stop(2)


def test_the_quiet_period_starts_again_with_the_new_agent_and_then_the_gpu_recovers(
    node: tuple[_Node, _Scheduler],
) -> None:
    n, scheduler = node
    uuid = _fail_gpu0_then_stop(n, scheduler)
    before = len(scheduler.reports)
    agent, _ = n.agent(quiet_s=1.0)
    try:
        _wait(lambda: len(scheduler.gpus()) > before)
        assert scheduler.gpus()[before][0] == (uuid, False, "Xid48")
        _wait(lambda: scheduler.gpus()[-1][0][1], timeout=10.0)
    finally:
        agent.stop(2)
    # Recovered: the record no longer lists it, so a third agent starts with it healthy.
    assert json.loads(Path(health_record_path(n.config(1.0))).read_text())["unhealthy"] == {}


def test_a_record_from_an_earlier_boot_is_ignored(node: tuple[_Node, _Scheduler]) -> None:
    n, scheduler = node
    _fail_gpu0_then_stop(n, scheduler)
    n.set_boot("boot-2")  # a reboot resets the GPUs
    before = len(scheduler.reports)
    agent, _ = n.agent(quiet_s=30.0)
    try:
        _wait(lambda: len(scheduler.gpus()) > before)
        assert all(healthy for (_, healthy, _) in scheduler.gpus()[before])
    finally:
        agent.stop(2)


# --- the record itself --------------------------------------------------------------------------


def test_the_record_round_trips_and_belongs_to_one_boot(tmp_path: Path) -> None:
    path = tmp_path / "state" / "gpu-health.json"
    HealthRecord(path, boot_id="a").save({"GPU-1": "Xid79", "GPU-0": "lost: not found by NVML"})
    assert HealthRecord(path, boot_id="a").load() == {"GPU-0": "lost: not found by NVML", "GPU-1": "Xid79"}
    assert HealthRecord(path, boot_id="b").load() == {}
    # No boot ID readable: the record is taken as this boot's rather than dropped.
    assert HealthRecord(path, boot_id="").load() == {"GPU-0": "lost: not found by NVML", "GPU-1": "Xid79"}
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


@pytest.mark.parametrize("content", ["not json", "[]", '{"boot_id": "a"}', '{"unhealthy": ["GPU-0"]}'])
def test_a_record_that_is_not_one_is_ignored_with_a_warning(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "gpu-health.json"
    path.write_text(content)
    with caplog.at_level(logging.WARNING):
        assert HealthRecord(path, boot_id="a").load() == {}
    assert str(path) in caplog.text


def test_a_record_in_a_directory_others_may_write_is_neither_trusted_nor_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    path = shared / "gpu-health.json"
    path.write_text(json.dumps({"boot_id": "a", "unhealthy": {"GPU-0": "Xid48"}}))
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        assert HealthRecord(path, boot_id="a").load() == {}
        HealthRecord(path, boot_id="a").save({"GPU-1": "Xid79"})  # logged, not raised
    assert "writable by group or others" in caplog.text and "chmod go-w" in caplog.text
    assert "GPU-1" not in path.read_text()


def test_a_link_planted_at_the_record_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"boot_id": "a", "unhealthy": {"GPU-0": "Xid48"}}))
    path = tmp_path / "gpu-health.json"
    path.symlink_to(target)
    assert HealthRecord(path, boot_id="a").load() == {}
    HealthRecord(path, boot_id="a").save({})
    assert not path.is_symlink() and "GPU-0" in target.read_text()


def test_restore_counts_the_quiet_period_from_the_restart() -> None:
    tracker = HealthTracker(quiet_period_s=10.0)
    tracker.restore("GPU-0", "Xid79", now=100.0)
    assert tracker.unhealthy() == {"GPU-0": "Xid79"}
    assert tracker.on_check("GPU-0", ok=True, now=109.0) is None
    # The same failure seen again announces nothing new: the GPU was already reported unhealthy.
    assert tracker.on_xid("GPU-0", 79, now=105.0) is None
    t = tracker.on_check("GPU-0", ok=True, now=115.5)
    assert t is not None and t.healthy and tracker.unhealthy() == {}


def test_the_boot_id_is_read_from_the_proc_root(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("3f1c\n")
    assert read_boot_id(str(tmp_path)) == "3f1c"
    assert read_boot_id(str(tmp_path / "missing")) == ""
