"""Reserve, assume, confirm, expire; pods and devices coming and going; one model per job."""

from __future__ import annotations

import json

import pytest

from apis import names
from apis.allocation import Allocation, GPUShare, decode_allocation
from scheduler_plugin.core.api import Code, NodeName, PodRequest, PodUID, SchedulingError
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import GiB, gpu, info, node, pod, share, whole

N1 = NodeName("n1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def one_gpu(clock: FakeClock) -> Scheduler:
    scheduler = Scheduler(assume_ttl_s=30, clock=clock)
    scheduler.upsert_node_devices(node("n1", 1))
    return scheduler


def _fits(scheduler: Scheduler, request_pod: PodRequest) -> bool:
    [verdict] = scheduler.filter(request_pod, [N1])
    return verdict.feasible


def test_an_assumed_allocation_counts_as_used(one_gpu: Scheduler) -> None:
    one_gpu.reserve(pod("a", share(60, gib=40)), N1)
    assert not _fits(one_gpu, pod("b", share(60, gib=40)))
    assert one_gpu.is_assumed(PodUID("uid-a"))


def test_an_assumed_allocation_expires_after_the_ttl(one_gpu: Scheduler, clock: FakeClock) -> None:
    one_gpu.reserve(pod("a", whole(1)), N1)
    clock.now += 29
    assert one_gpu.expire_assumed() == []
    clock.now += 1
    assert one_gpu.expire_assumed() == [PodUID("uid-a")]
    assert _fits(one_gpu, pod("b", whole(1)))
    assert one_gpu.allocation_of(PodUID("uid-a")) is None


def test_a_confirmed_allocation_never_expires_and_unreserve_leaves_it(
    one_gpu: Scheduler, clock: FakeClock
) -> None:
    one_gpu.reserve(pod("a", whole(1)), N1)
    one_gpu.confirm(PodUID("uid-a"))
    clock.now += 3600
    assert one_gpu.expire_assumed() == []
    one_gpu.unreserve(PodUID("uid-a"))
    assert not _fits(one_gpu, pod("b", whole(1)))


def test_unreserve_is_idempotent(one_gpu: Scheduler) -> None:
    one_gpu.reserve(pod("a", whole(1)), N1)
    one_gpu.unreserve(PodUID("uid-a"))
    one_gpu.unreserve(PodUID("uid-a"))
    one_gpu.unreserve(PodUID("never-seen"))
    assert _fits(one_gpu, pod("b", whole(1)))


def test_reserving_again_on_the_same_node_returns_the_same_allocation(one_gpu: Scheduler) -> None:
    first = one_gpu.reserve(pod("a", share(30, gib=10)), N1)
    assert one_gpu.reserve(pod("a", share(30, gib=10)), N1) == first
    assert one_gpu.node_views()[0].gpus[0].allocated_core_percent == 30


def test_reserve_on_a_node_that_no_longer_fits_raises_unschedulable(one_gpu: Scheduler) -> None:
    one_gpu.reserve(pod("a", whole(1)), N1)
    with pytest.raises(SchedulingError) as caught:
        one_gpu.reserve(pod("b", share(10, gib=1)), N1)
    assert caught.value.status.code is Code.UNSCHEDULABLE
    assert "node n1: no GPU has 10% core and 1Gi memory free" in str(caught.value)


def test_reserve_on_an_unknown_node_is_unresolvable(one_gpu: Scheduler) -> None:
    with pytest.raises(SchedulingError) as caught:
        one_gpu.reserve(pod("a", whole(1)), NodeName("ghost"))
    assert caught.value.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE


def test_add_pod_is_idempotent_and_remove_pod_frees(one_gpu: Scheduler) -> None:
    held = Allocation(gpus=(GPUShare(0, "GPU-n1-0", 50, 40 * GiB, 50),))
    for _ in range(3):
        one_gpu.add_pod(pod("a", share(50, ratio=50)), N1, held)
    assert one_gpu.node_views()[0].gpus[0].allocated_core_percent == 50
    one_gpu.remove_pod(PodUID("uid-a"))
    one_gpu.remove_pod(PodUID("uid-a"))
    assert one_gpu.node_views()[0].gpus[0].allocated_core_percent == 0


def test_a_bound_pod_seen_without_its_annotation_keeps_the_reserved_shares(one_gpu: Scheduler) -> None:
    reserved = one_gpu.reserve(pod("a", share(50, gib=10)), N1)
    one_gpu.add_pod(pod("a", share(50, gib=10)), N1, None)
    assert not one_gpu.is_assumed(PodUID("uid-a"))
    assert one_gpu.allocation_of(PodUID("uid-a")) == (N1, reserved)


def test_cpu_and_memory_of_pods_count_against_the_node() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_info(info("n1", cpu=4000, memory_gib=8))
    scheduler.add_pod(pod("a", cpu=3000, memory_gib=4), N1, None)
    [verdict] = scheduler.filter(pod("b", cpu=2000), [N1])
    assert verdict.reason == "insufficient cpu: 1000m free, pod needs 2000m"
    scheduler.remove_pod(PodUID("uid-a"))
    assert scheduler.filter(pod("b", cpu=2000), [N1])[0].feasible


def test_allocations_on_vanished_gpus_are_reported_not_dropped(one_gpu: Scheduler) -> None:
    one_gpu.upsert_node_devices(node("n1", 2))
    one_gpu.add_pod(pod("a", whole(1)), N1, Allocation(gpus=(GPUShare(1, "GPU-n1-1", 100, 80 * GiB, 100),)))
    lines = one_gpu.upsert_node_devices(node("n1", 1))
    assert lines == [
        "pod default/a holds GPU GPU-n1-1 (minor 1) on node n1, which the node no longer reports; its share is not counted"
    ]
    assert one_gpu.allocation_of(PodUID("uid-a")) is not None
    # The GPU comes back: the pod's share counts again.
    assert one_gpu.upsert_node_devices(node("n1", 2)) == []
    assert one_gpu.node_views()[0].gpus[1].allocated_core_percent == 100


def test_an_unhealthy_gpu_takes_no_new_pods_but_keeps_its_existing_ones(one_gpu: Scheduler) -> None:
    one_gpu.reserve(pod("a", share(20, gib=10)), N1)
    one_gpu.upsert_node_devices(node("n1", 1, unhealthy=[0]))
    assert not _fits(one_gpu, pod("b", share(20, gib=10)))
    assert one_gpu.node_views()[0].gpus[0].pods[0].name == "a"


def test_pods_of_one_job_stay_on_the_model_of_the_first() -> None:
    scheduler = Scheduler(policy="binpack")
    scheduler.upsert_node_devices(node("a100", 1, model="A100-SXM4-80GB"))
    scheduler.upsert_node_devices(node("h100", 2, model="H100-SXM5-80GB"))
    first = pod("w0", whole(1), job="default/train")
    target = scheduler.select(first)
    assert target is not None
    scheduler.reserve(first, target)
    model = "A100-SXM4-80GB" if target == "a100" else "H100-SXM5-80GB"
    assert scheduler.job_models() == {"default/train": model}
    second = pod("w1", whole(1), job="default/train")
    verdicts = {v.node_name: v for v in scheduler.filter(second)}
    other = "h100" if target == "a100" else "a100"
    assert not verdicts[NodeName(other)].feasible
    assert f"job default/train runs on model {model}" in verdicts[NodeName(other)].reason


def test_a_job_model_is_forgotten_with_the_jobs_last_pod() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("t4", 1, model="T4", memory_gib=16))
    scheduler.upsert_node_devices(node("a10", 1, model="A10", memory_gib=24))
    scheduler.reserve(pod("w0", whole(1), job="default/j"), NodeName("t4"))
    scheduler.add_pod(pod("w1", None, job="default/j"), NodeName("t4"), None)
    scheduler.unreserve(PodUID("uid-w0"))
    assert scheduler.job_models() == {"default/j": "T4"}  # w1 still counts
    scheduler.remove_pod(PodUID("uid-w1"))
    assert scheduler.job_models() == {}
    assert scheduler.filter(pod("w2", whole(1), job="default/j"), [NodeName("a10")])[0].feasible


def test_removing_a_node_makes_it_unknown_and_views_skip_it() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("n1", 1))
    scheduler.remove_node(N1)
    assert not scheduler.filter(pod("p", whole(1)), [N1])[0].feasible
    assert scheduler.node_views() == []
    assert scheduler.select(pod("p", whole(1))) is None


def test_node_views_list_gpus_with_their_pods_and_external_holders() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("n1", 2, external=[1]))
    scheduler.reserve(pod("a", share(25, gib=20)), N1)
    [view] = scheduler.node_views([N1])
    assert view.driver_version == "550.54.15"
    first, second = view.gpus
    assert (first.allocated_core_percent, first.allocated_memory_bytes) == (25, 20 * GiB)
    assert [(p.name, p.assumed) for p in first.pods] == [("a", True)]
    assert second.held_externally and second.pods == ()


def test_a_node_with_more_gpus_than_ever_seen_widens_the_state() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("small", 2))
    scheduler.upsert_node_devices(
        node("big", gpus=[gpu("big", i, model="L4", memory_gib=24) for i in range(16)])
    )
    allocation = scheduler.reserve(pod("p", whole(16)), NodeName("big"))
    assert len(allocation.gpus) == 16
    assert scheduler.filter(pod("q", whole(2)), [NodeName("small")])[0].feasible


def _koordinator_annotation(entry: dict[str, object]) -> Allocation:
    """An allocation as Koordinator's own scheduler may write it, read the way bound pods are."""
    return decode_allocation(json.dumps({names.DEVICE_TYPE_GPU: [entry]}))


def test_a_share_named_by_minor_only_is_counted_on_that_gpu() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("n1", 2))
    allocation = _koordinator_annotation(
        {"minor": 1, "resources": {names.GPU_CORE: "100", names.GPU_MEMORY: "80Gi", names.GPU_MEMORY_RATIO: "100"}}
    )
    scheduler.add_pod(pod("koord"), N1, allocation)
    [view] = scheduler.node_views([N1])
    assert [g.allocated_core_percent for g in view.gpus] == [0, 100]
    assert sorted(g.minor for g in scheduler.reserve(pod("p", whole(1)), N1).gpus) == [0]
    assert not _fits(scheduler, pod("q", share(10, gib=1)))


def test_a_share_with_a_memory_ratio_but_no_memory_counts_its_part_of_the_gpu(one_gpu: Scheduler) -> None:
    allocation = _koordinator_annotation(
        {"id": "GPU-n1-0", "minor": 0, "resources": {names.GPU_CORE: "30", names.GPU_MEMORY_RATIO: "75"}}
    )
    one_gpu.add_pod(pod("koord"), N1, allocation)
    [view] = one_gpu.node_views([N1])
    assert view.gpus[0].allocated_memory_bytes == 60 * GiB
    assert not _fits(one_gpu, pod("p", share(30, gib=30)))
    assert _fits(one_gpu, pod("q", share(30, gib=20)))
