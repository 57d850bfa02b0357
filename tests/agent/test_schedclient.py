"""ReportDevices to the scheduler service: sent on change and on resync, and again after it restarts."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace

import grpc
import pytest

from agent.discovery import discover
from agent.errors import SchedulerUnavailable
from agent.metrics import AgentMetrics
from agent.pcitopology import InventoryTopology
from agent.resync_loop import ReportLoop
from agent.schedclient import SchedulerReporter
from agent.usage import GPUUsage, ProcessUsage
from apis.devices import NodeDevices, from_proto
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.agent.helpers import T4, started_fake
from tests.waiting import wait_until as _wait


class StandIn(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self.reports: list[scheduler_pb2.ReportDevicesRequest] = []
        self.lock = threading.Lock()

    def ReportDevices(
        self, request: scheduler_pb2.ReportDevicesRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.ReportDevicesResponse:
        with self.lock:
            self.reports.append(request)
        return scheduler_pb2.ReportDevicesResponse(orphaned_allocations=["ml/old-pod: GPU-gone"])


class Scheduler:
    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.stand_in = StandIn()
        self.server: grpc.Server | None = None

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(self.stand_in, self.server)  # type: ignore[no-untyped-call]
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    tmp = tempfile.mkdtemp(prefix="fgpu-sched-")
    s = Scheduler(os.path.join(tmp, "sched.sock"))
    s.start()
    yield s
    s.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def _devices() -> NodeDevices:
    nvml, inventory = started_fake(T4)
    return discover(nvml, node_name="n1", topology=InventoryTopology(inventory)).devices



def test_the_report_carries_devices_usage_and_a_timestamp(scheduler: Scheduler) -> None:
    devices = _devices()
    usage = (GPUUsage(uuid=devices.gpus[0].uuid, sm_utilization_percent=40, processes=(ProcessUsage(7, "pod-a", "c1", 2**30),)),)
    reporter = SchedulerReporter(f"unix://{scheduler.socket}")
    assert reporter.report(devices, usage, force=False)
    reporter.close()
    sent = scheduler.stand_in.reports[0].report
    assert from_proto(sent) == devices
    assert sent.usage[0].processes[0].pod_uid == "pod-a" and sent.observed_at.seconds > 0


def test_an_unchanged_report_is_not_sent_again_unless_forced(scheduler: Scheduler) -> None:
    devices = _devices()
    reporter = SchedulerReporter(f"unix://{scheduler.socket}")
    assert reporter.report(devices, (), force=False)
    assert not reporter.report(devices, (), force=False)
    assert reporter.report(replace(devices, gpus=devices.gpus[:2]), (), force=False)
    assert reporter.report(replace(devices, gpus=devices.gpus[:2]), (), force=True)
    reporter.close()
    assert len(scheduler.stand_in.reports) == 3


def test_a_scheduler_that_is_down_is_an_error_the_loop_retries(scheduler: Scheduler) -> None:
    scheduler.stop()
    reporter = SchedulerReporter(f"unix://{scheduler.socket}", timeout_s=0.5)
    with pytest.raises(SchedulerUnavailable, match="ReportDevices failed"):
        reporter.report(_devices(), (), force=True)
    reporter.close()


def test_a_restarted_scheduler_gets_the_report_again(scheduler: Scheduler) -> None:
    devices = _devices()
    reporter = SchedulerReporter(f"unix://{scheduler.socket}", timeout_s=0.5)
    def send() -> None:
        reporter.report(devices, (), force=True)

    loop = ReportLoop(
        target="scheduler", report=send, resync_s=0.2,
        metrics=AgentMetrics(), backoff_initial_s=0.05, backoff_max_s=0.2,
    )
    loop.start()
    try:
        _wait(lambda: len(scheduler.stand_in.reports) >= 1)
        scheduler.stop()
        _wait(lambda: loop.failures >= 1)
        scheduler.stand_in.reports.clear()
        scheduler.start()
        _wait(lambda: len(scheduler.stand_in.reports) >= 1)
    finally:
        loop.stop()
        reporter.close()
