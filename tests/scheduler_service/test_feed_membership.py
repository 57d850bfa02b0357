"""The state feed against the service: nodes leaving in the garbage collector's order, a pod deleted
while its bind answers, waiting pods retried when room appears, and inventories listing a GPU twice."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from apis import grpc_server, names
from apis.device_object import from_device_object, from_unique_device_object
from apis.devices import DeviceError, NodeDevices, to_device_object, to_proto
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.backend_kubernetes import devices_of, node_info
from scheduler_plugin.config import SchedulerConfig, StateBackend
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.errors import InvalidRequest, Unschedulable
from scheduler_plugin.scheduling import SchedulingService
from scheduler_plugin.standalone import PendingQueue, StandaloneLoop
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, pod, whole_pod
from tests.scheduler_service.conftest import KEY

N1 = NodeName("n1")


class HookedBackend(EmbeddedBackend):
    """The embedded backend, running a hook once a bind has been made durable (before it answers)."""

    def __init__(self, *, path: str) -> None:
        super().__init__(path=path)
        self.after_bind: Callable[[Mapping[str, Any]], None] = lambda pod: None

    def bind(self, *, pod: Mapping[str, Any], node: NodeName, annotations: Mapping[str, str]) -> None:
        super().bind(pod=pod, node=node, annotations=annotations)
        self.after_bind(pod)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[HookedBackend]:
    hooked = HookedBackend(path=str(tmp_path / "state.db"))
    yield hooked
    hooked.stop()


@pytest.fixture
def service(backend: HookedBackend) -> SchedulingService:
    built = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=KEY)
    backend.start(built)
    return built


def _node(name: str, *, cordoned: bool = False, zone: str = "a") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"zone": zone}},
        "spec": {"unschedulable": cordoned},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _cpu_fits(service: SchedulingService, name: str = "n1") -> bool:
    [verdict] = service.filter(pod("web", requests={"cpu": "1"}), [name]).verdicts
    return verdict.feasible


# --- nodes leaving -----------------------------------------------------------------------------


def test_a_device_deleted_after_its_node_brings_nothing_back(service: SchedulingService) -> None:
    service.on_node(node_info(_node("n1")))
    service.on_devices(gpu_node("n1", gpus=1))
    service.on_node_removed(N1)
    service.on_devices_removed(N1)
    assert service.node_views() == []
    assert not _cpu_fits(service)
    with pytest.raises(Unschedulable):
        service.bind(pod("web", requests={"cpu": "1"}), "n1")


def test_a_device_deleted_while_its_node_stays_clears_the_gpus_only(service: SchedulingService) -> None:
    service.on_node(node_info(_node("n1")))
    service.on_devices(gpu_node("n1", gpus=1))
    service.on_devices_removed(N1)
    [view] = service.node_views(["n1"])
    assert view.gpus == ()
    assert _cpu_fits(service)
    with pytest.raises(Unschedulable):
        service.bind(whole_pod("train"), "n1")


def test_when_nodes_come_from_node_objects_a_device_alone_takes_no_pod(
    service: SchedulingService, backend: HookedBackend
) -> None:
    service.require_node_objects()  # what the kubernetes backend asks on start
    service.on_devices(gpu_node("n1", gpus=1))
    assert not _cpu_fits(service)
    service.on_node(node_info(_node("n1")))
    assert _cpu_fits(service)
    service.on_node_removed(N1)
    service.on_devices(gpu_node("n1", gpus=1))  # a relist while the collector has not deleted the Device
    assert not _cpu_fits(service)
    # A rebuild (a new leader's resync) keeps the rule.
    service.load(dataclasses.replace(backend.snapshot(), devices=(gpu_node("n1", gpus=1),)))
    assert not _cpu_fits(service)


# --- a pod deleted while its bind answers -------------------------------------------------------


def test_a_pod_deleted_before_its_bind_answers_holds_no_gpu(service: SchedulingService, backend: HookedBackend) -> None:
    service.on_devices(gpu_node("n1", gpus=1))
    first = whole_pod("first")

    def seen_bound_then_deleted(bound: Mapping[str, Any]) -> None:
        on_node = {**bound, "spec": {**bound["spec"], "nodeName": "n1"}}
        service.on_pod(on_node)
        service.on_pod_removed(on_node)

    backend.after_bind = seen_bound_then_deleted
    service.bind(first, "n1")
    backend.after_bind = lambda pod: None
    assert service.allocation_of(first["metadata"]["uid"]) is None
    assert service.bind(whole_pod("second"), "n1").allocation.uuids == ("GPU-n1-00",)
    # The record of the deletion went with the bind: another pod's bind is counted as usual.
    with pytest.raises(Unschedulable):
        service.bind(whole_pod("third"), "n1")


# --- waiting pods and room appearing -------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _waiting(service: SchedulingService) -> tuple[PendingQueue, _Clock, StandaloneLoop]:
    clock = _Clock()
    queue = PendingQueue(clock=clock)
    service.pending = queue
    loop = StandaloneLoop(service=service, queue=queue, is_leader=lambda: True)
    service.on_pod(whole_pod("train", scheduler_name=names.SCHEDULER_NAME))
    for _ in range(6):  # fails each time: its backoff grows to the 30 s cap
        popped = queue.pop(timeout_s=0)
        assert popped is not None
        loop.schedule_one(popped)
        clock.now += 60
    clock.now -= 59  # it failed just now: due again in 30 s
    return queue, clock, loop


def _retry_once(queue: PendingQueue, loop: StandaloneLoop) -> None:
    popped = queue.pop(timeout_s=0)
    assert popped is not None, "the waiting pod was not retried"
    loop.schedule_one(popped)


def test_waiting_pods_are_retried_when_a_node_is_uncordoned_but_not_on_a_repeat(service: SchedulingService) -> None:
    service.on_devices(gpu_node("n1", gpus=1))
    service.on_node(node_info(_node("n1", cordoned=True)))
    queue, _, loop = _waiting(service)
    service.on_node(node_info(_node("n1", cordoned=True)))  # a status heartbeat: the same facts
    service.on_devices(gpu_node("n1", gpus=1))  # the agent rewrites the same inventory
    assert queue.pop(timeout_s=0) is None
    service.on_node(node_info(_node("n1")))  # uncordoned
    _retry_once(queue, loop)
    assert len(queue) == 0, "the pod should be bound to the uncordoned node"


def test_waiting_pods_are_retried_when_a_gpu_heals_or_a_node_is_relabelled(service: SchedulingService) -> None:
    service.on_node(node_info(_node("n1")))
    service.on_devices(gpu_node("n1", gpus=1, unhealthy=(0,)))
    queue, _, loop = _waiting(service)
    service.on_node(node_info(_node("n1", zone="b")))  # relabelled: may match a selector now
    _retry_once(queue, loop)  # still no healthy GPU: fails again
    assert queue.pop(timeout_s=0) is None
    service.on_devices(gpu_node("n1", gpus=1))  # the GPU is healthy again
    _retry_once(queue, loop)
    assert len(queue) == 0


# --- one GPU listed twice ----------------------------------------------------------------------


def _doubled(devices: NodeDevices) -> NodeDevices:
    first, second = devices.gpus[:2]
    return dataclasses.replace(devices, gpus=(first, dataclasses.replace(second, uuid=first.uuid), *devices.gpus[2:]))


def test_a_report_listing_a_gpu_twice_is_refused_and_not_stored(
    embedded_service: Callable[[], SchedulingService],
) -> None:
    service = embedded_service()
    with pytest.raises(InvalidRequest, match=r"report.gpus\[1\] has UUID 'GPU-n1-00', which report.gpus\[0\] has already"):
        service.report_devices(_doubled(gpu_node("n1", gpus=2)))
    assert service.node_views() == []
    assert embedded_service().node_views() == [], "the refused report was kept and read back on restart"


def test_a_device_listing_a_gpu_twice_is_ignored_by_the_informer_and_the_node_keeps_its_gpus(
    service: SchedulingService, caplog: pytest.LogCaptureFixture
) -> None:
    good = gpu_node("n1", gpus=2)
    service.on_devices(good)
    bad = to_device_object(_doubled(good))
    # A Device with a non-GPU entry first: the error names the entries as the object numbers them.
    bad["spec"]["devices"].insert(0, {"type": "rdma", "id": "mlx5_0"})
    with pytest.raises(DeviceError, match=r"spec.devices\[2\] has UUID 'GPU-n1-00', which spec.devices\[1\] has already"):
        from_unique_device_object(bad)
    with caplog.at_level(logging.ERROR):
        assert devices_of(bad) is None
    assert "GPU-n1-00" in caplog.text
    service.on_devices(from_device_object(bad))  # read without the check: the service refuses it too
    [view] = service.node_views(["n1"])
    assert [g.device.uuid for g in view.gpus] == ["GPU-n1-00", "GPU-n1-01"]
    held = sorted(u for i in range(2) for u in service.bind(whole_pod(f"w{i}"), "n1").allocation.uuids)
    assert held == ["GPU-n1-00", "GPU-n1-01"]
    with pytest.raises(Unschedulable):
        service.bind(whole_pod("w2"), "n1")


def test_report_devices_over_grpc_answers_invalid_argument_for_a_gpu_listed_twice(tmp_path: Path, key_file: str) -> None:
    socket = tmp_path / "sched.sock"
    config = SchedulerConfig(
        state=StateBackend.EMBEDDED, db=str(tmp_path / "state.db"), grpc_listen=f"unix://{socket}", signing_key=key_file
    )
    app = SchedulerApp(config, timing=cluster.FAST)
    app.start()
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(grpc_server.insecure_channel(f"unix://{socket}"))  # type: ignore[no-untyped-call]
        request = scheduler_pb2.ReportDevicesRequest(report=to_proto(_doubled(gpu_node("n1", gpus=2))))
        with pytest.raises(grpc.RpcError) as caught:
            stub.ReportDevices(request)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "GPU-n1-00" in (caught.value.details() or "")
    finally:
        app.stop(1.0)
