"""What the scheduler writes for pods without GPUs and for pods whose GPUs several containers share."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from apis import names
from apis.signing import verify_pod_annotations
from scheduler_plugin.errors import InvalidRequest
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import gpu_node, pod, share_pod
from tests.scheduler_service.conftest import KEY

Build = Callable[[], SchedulingService]


def test_a_pod_without_gpus_is_bound_without_an_allocation(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=1))
    cpu = pod("cpu", requests={"cpu": "1"})

    signed = service.bind(cpu, "n1")

    assert names.DEVICE_ALLOCATED not in signed.annotations
    assert signed.annotation == "" and not signed.allocation.gpus
    # The stored (bound) pod carries none either, so the node treats it as a plain pod.
    restarted = embedded_service()
    assert restarted.bind(cpu, "n1").annotations == {}


def test_a_single_gpu_container_is_named_for_every_share_it_gets(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=1))
    p = share_pod("p", core=50, memory="10Gi")

    signed = service.bind(p, "n1")

    allocation = verify_pod_annotations(KEY.verifying_keys(), pod_uid=p["metadata"]["uid"], node_name="n1", annotations=signed.annotations)
    assert allocation is not None
    (share,) = allocation.gpus
    assert [(c.name, c.core_percent, c.memory_bytes) for c in share.containers] == [("main", 50, 10 * 2**30)]


def _two_containers(a: tuple[str, str], b: tuple[str, str]) -> dict[str, object]:
    p = pod("two")
    p["spec"]["containers"] = [  # type: ignore[index]
        {"name": "log", "image": "busybox"},
        {"name": "a", "resources": {"limits": {names.GPU_CORE: a[0], names.GPU_MEMORY_RATIO: a[1]}}},
        {"name": "b", "resources": {"limits": {names.GPU_CORE: b[0], names.GPU_MEMORY_RATIO: b[1]}}},
    ]
    return p


def test_two_gpu_containers_get_their_own_parts_and_a_sidecar_none(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=1, memory_gib=80))
    signed = service.bind(_two_containers(("30", "30"), ("20", "20")), "n1")

    (share,) = signed.allocation.gpus
    assert (share.core_percent, share.memory_ratio_percent) == (50, 50)
    parts = {c.name: (c.core_percent, c.memory_bytes) for c in share.containers}
    assert parts == {"a": (30, 80 * 2**30 * 30 // 100), "b": (20, 80 * 2**30 * 20 // 100)}


def test_containers_whose_own_requests_cannot_share_the_cards_each_get_an_even_part_of_every_card(
    embedded_service: Build,
) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=2))
    p = _two_containers(("100", "100"), ("100", "100"))
    # "a" asks for half of each of two cards and "b" for one whole card: alone they do not fit the pod's
    # two whole cards together. Koordinator accepts the pod (it checks only the sum), so fgpu gives each
    # container its own amounts spread evenly over all the pod's cards (apis/request.py, container_requests).
    p["spec"]["containers"][1]["resources"]["limits"][names.GPU_SHARED] = "2"  # type: ignore[index]

    signed = service.bind(p, "n1")

    assert len(signed.allocation.gpus) == 2
    for share in signed.allocation.gpus:
        assert {c.name: (c.core_percent, c.memory_ratio_percent) for c in share.containers} == {"a": (50, 50), "b": (50, 50)}


def test_a_pod_whose_allocation_cannot_be_written_keeps_nothing_reserved(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=1, memory_gib=80))
    # Two containers of one name (the API server would refuse it; a gRPC caller need not).
    twins = _two_containers(("30", "30"), ("20", "20"))
    for c in twins["spec"]["containers"]:  # type: ignore[index]
        c["name"] = "same"
    with pytest.raises(InvalidRequest, match="listed twice"):
        service.bind(twins, "n1")
    # The card is whole again: a pod asking for all of it still fits.
    assert service.bind(share_pod("after", core=100, memory="80Gi"), "n1").allocation.gpus
