from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from apis import names
from apis.allocation import decode_allocation
from apis.signing import verify_pod_annotations
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.errors import Conflict, NotLeader, Unschedulable
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import gpu_node, share_pod, t4_node, whole_pod
from tests.scheduler_service.conftest import KEY
from tests.scheduler_service.views import state_of

Build = Callable[[], SchedulingService]


def test_bind_writes_a_signed_allocation_the_agent_accepts(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=2))
    pod = share_pod("p1", core=50, memory="10Gi")

    signed = service.bind(pod, "n1")

    allocation = verify_pod_annotations(KEY.verifying_keys(), pod_uid=pod["metadata"]["uid"], node_name="n1", annotations=signed.annotations)
    assert allocation == signed.allocation
    assert [(g.core_percent, g.memory_bytes) for g in allocation.gpus] == [(50, 10 * 1024**3)]
    assert signed.annotations[names.ALLOCATION_NODE] == "n1"


def test_state_after_a_restart_equals_state_before(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=4))
    service.report_devices(t4_node("n2"))
    for i in range(5):
        service.bind(share_pod(f"s{i}", core=30, memory="5Gi"), "n1")
    service.bind(whole_pod("w", gpus=2), "n1")
    service.bind(share_pod("t", core=100, memory="16Gi"), "n2")
    before = state_of(service)

    restarted = embedded_service()

    assert state_of(restarted) == before
    assert restarted.ready


def test_a_reservation_that_was_never_bound_is_not_kept_across_restart(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=1))
    service.reserve(whole_pod("reserved-only"), "n1")

    restarted = embedded_service()

    assert restarted.bind(whole_pod("next"), "n1").allocation.gpus[0].uuid == "GPU-n1-00"


def test_binding_to_a_full_gpu_is_refused_and_leaves_nothing_behind(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=1))
    service.bind(whole_pod("first"), "n1")
    before = state_of(service)

    with pytest.raises(Unschedulable, match="n1"):
        service.bind(whole_pod("second"), "n1")

    assert state_of(service) == before
    assert state_of(embedded_service()) == before


def test_binding_again_to_the_same_node_is_a_no_op(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=2))
    pod = share_pod("p", core=50)
    first = service.bind(pod, "n1")

    second = service.bind(pod, "n1")

    assert second.annotations == first.annotations
    assert sum(g.allocated_core_percent for v in service.node_views() for g in v.gpus) == 50


def test_binding_a_bound_pod_to_another_node_is_a_conflict(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=1))
    service.report_devices(gpu_node("n2", gpus=1))
    pod = whole_pod("p")
    service.bind(pod, "n1")

    with pytest.raises(Conflict, match="bound to node n1"):
        service.bind(pod, "n2")


def test_unreserve_of_a_bound_pod_releases_it_for_good(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=1))
    pod = whole_pod("p")
    service.bind(pod, "n1")

    assert service.unreserve(pod) is True

    assert state_of(embedded_service()) == state_of(service)
    assert all(g.allocated_core_percent == 0 for v in service.node_views() for g in v.gpus)


def test_a_vanished_gpu_with_an_allocation_is_reported_not_dropped(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=2))
    pod = whole_pod("p", gpus=2)
    service.bind(pod, "n1")

    orphans = service.report_devices(gpu_node("n1", gpus=1))

    assert any("GPU-n1-01" in line and "default/p" in line for line in orphans)
    assert service.metrics.orphaned_allocations._value.get() == 1
    restarted = embedded_service()
    assert any("GPU-n1-01" in line for line in restarted.orphans)
    assert restarted.allocation_of(pod["metadata"]["uid"]) is not None


def test_a_standby_refuses_to_bind(tmp_path: Path) -> None:
    backend = EmbeddedBackend(path=str(tmp_path / "standby.db"))
    standby = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=KEY, is_leader=lambda: False)
    backend.start(standby)
    standby.report_devices(gpu_node("n1", gpus=1))

    with pytest.raises(NotLeader, match="standby"):
        standby.bind(whole_pod("p"), "n1")
    backend.stop()


def test_the_annotation_decodes_to_the_returned_allocation(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=8))

    signed = service.bind(whole_pod("four", gpus=4), "n1")

    assert decode_allocation(signed.annotation) == signed.allocation
    assert len({g.uuid for g in signed.allocation.gpus}) == 4
