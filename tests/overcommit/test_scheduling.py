"""The scheduler's burstable rule: requests reserved as always, burstable limits within the pool's
ratio of what guaranteed shares leave, and no burstable share where the node pool allows none."""

from __future__ import annotations

import pytest

from apis import names
from apis.allocation import decode_allocation, encode_allocation
from apis.device_request import DeviceRequest
from apis.devices import NodeDevices
from apis.overcommit import Burst
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import GiB, gpu, info, node, pod, share


def _burstable(core: int, gib: int, *, core_limit: int, gib_limit: int) -> DeviceRequest:
    return DeviceRequest(
        gpus=1, core_percent=core, memory_bytes=gib * GiB, memory_ratio_percent=None, whole=False,
        source="koordinator", limit=Burst(core_percent=core_limit, memory_bytes=gib_limit * GiB, memory_ratio_percent=None),
    )


def _one_gpu_node(ratio: str | None) -> Scheduler:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("n1", 1, memory_gib=80))
    labels = {names.NODE_BURSTABLE_RATIO: ratio} if ratio is not None else {}
    scheduler.upsert_node_info(info("n1", labels=labels))
    return scheduler


def _fits(scheduler: Scheduler, name: str, device: object) -> bool:
    verdicts = scheduler.filter(pod(name, device))  # type: ignore[arg-type]
    return verdicts[0].feasible


def test_a_node_without_the_ratio_label_takes_no_burstable_share() -> None:
    scheduler = _one_gpu_node(None)
    assert not _fits(scheduler, "b", _burstable(10, 8, core_limit=20, gib_limit=16))
    assert _fits(scheduler, "g", share(10, gib=8))


@pytest.mark.parametrize("bad", ["abc", "0.5", "11", ""])
def test_an_invalid_ratio_label_reads_as_no_overcommit(bad: str) -> None:
    assert not _fits(_one_gpu_node(bad), "b", _burstable(10, 8, core_limit=20, gib_limit=16))


def test_burstable_limits_stay_within_ratio_times_what_guaranteed_shares_leave() -> None:
    scheduler = _one_gpu_node("1.5")
    # A guaranteed pod holds 40 GiB: 40 GiB left, so burstable limits may sum to 60 GiB.
    scheduler.reserve(pod("g", share(40, gib=40)), NodeName("n1"))
    scheduler.reserve(pod("b1", _burstable(10, 10, core_limit=30, gib_limit=30)), NodeName("n1"))
    # 30 + 30 = 60 GiB of limits: exactly the ratio.
    assert _fits(scheduler, "b2", _burstable(10, 10, core_limit=30, gib_limit=30))
    # 30 + 31 GiB would exceed it, though the request (10 GiB) fits.
    assert not _fits(scheduler, "b3", _burstable(10, 10, core_limit=30, gib_limit=31))
    # compute: 60% left x 1.5 = 90; 30 + 61 is over.
    assert not _fits(scheduler, "b4", _burstable(10, 10, core_limit=61, gib_limit=10))


def test_a_limit_above_the_card_counts_as_the_card_and_never_leaves_the_int64_columns() -> None:
    # Limits the apis bound refuses today may still come from allocations signed before it (or the
    # in-memory request): the core clamps them to the card, as the node's hook does.
    huge = DeviceRequest(
        gpus=1, core_percent=10, memory_bytes=8 * GiB, memory_ratio_percent=None, whole=False, source="koordinator",
        limit=Burst(core_percent=10, memory_bytes=2**62, memory_ratio_percent=None),
    )
    scheduler = _one_gpu_node("10")
    for i in range(4):  # 4 x 2**62 would wrap int64; clamped, each counts 80 GiB (4 x 80 <= 10 x 80)
        allocation = scheduler.reserve(pod(f"huge-{i}", huge), NodeName("n1"))
        limit = allocation.gpus[0].limit
        assert limit is not None and limit.memory_bytes == 80 * GiB
    assert _fits(scheduler, "g", share(10, gib=8))
    ratio_one = _one_gpu_node("1")
    ratio_one.reserve(pod("huge", huge), NodeName("n1"))
    # Ratio 1: the clamped huge limit takes the whole card's room, so nothing more may burst here.
    assert not _fits(ratio_one, "b", _burstable(10, 8, core_limit=10, gib_limit=16))


def test_guaranteed_pods_count_requests_only_and_never_borrowed_capacity() -> None:
    scheduler = _one_gpu_node("2")
    scheduler.reserve(pod("b1", _burstable(20, 20, core_limit=100, gib_limit=80)), NodeName("n1"))
    # 60 GiB of requests are left for guaranteed shares, whatever the burstable limit.
    assert _fits(scheduler, "g1", share(80, gib=60))
    assert not _fits(scheduler, "g2", share(10, gib=61))


def test_the_signed_allocation_carries_the_limit_and_reads_back() -> None:
    scheduler = _one_gpu_node("1.5")
    allocation = scheduler.reserve(pod("b", _burstable(10, 8, core_limit=40, gib_limit=24)), NodeName("n1"))
    (gpu,) = allocation.gpus
    assert gpu.limit is not None
    assert (gpu.core_percent, gpu.memory_bytes) == (10, 8 * GiB)
    assert (gpu.limit.core_percent, gpu.limit.memory_bytes, gpu.limit.memory_ratio_percent) == (40, 24 * GiB, 30)
    text = encode_allocation(allocation)
    assert names.ALLOCATION_BURST_LIMIT in text
    assert decode_allocation(text) == allocation


def test_a_burstable_pod_is_never_served_by_a_mig_instance() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(NodeDevices(node_name="m", gpus=(gpu("m", 0, mig=[("3g.40gb", 40)]),)))
    scheduler.upsert_node_info(info("m", labels={names.NODE_BURSTABLE_RATIO: "2"}))
    assert not _fits(scheduler, "b", _burstable(10, 8, core_limit=20, gib_limit=16))
    assert _fits(scheduler, "g", share(10, gib=8))


# --- reasons: a burstable pod refused by the ratio alone says so, in bulk and one by one ---------------------


def _ratio_cluster() -> Scheduler:
    scheduler = Scheduler()
    for name, ratio in (("none", None), ("one", "1"), ("two", "2"), ("full", "2")):
        scheduler.upsert_node_devices(node(name, 2, memory_gib=80))
        scheduler.upsert_node_info(info(name, labels={names.NODE_BURSTABLE_RATIO: ratio} if ratio else {}))
    for minor in (0, 1):  # guaranteed 60 GiB on each card of "one": 20 GiB left, limits up to 20 GiB
        scheduler.reserve(pod(f"g{minor}", share(50, gib=60)), NodeName("one"))
    for minor in (0, 1):
        scheduler.reserve(pod(f"f{minor}", share(90, gib=75)), NodeName("full"))
    return scheduler


RATIO_CLUSTER = _ratio_cluster()


def test_a_node_without_the_label_says_it_takes_no_burstable_share_and_waiting_will_not_help() -> None:
    verdict = RATIO_CLUSTER.explain_node(pod("b", _burstable(10, 8, core_limit=20, gib_limit=16)), NodeName("none"))
    assert not verdict.feasible
    assert verdict.reason == (f"node takes no burstable GPU share (no valid {names.NODE_BURSTABLE_RATIO} label on "
                              "the node: its pool does not allow overcommit)")
    assert verdict.unresolvable


def test_a_node_whose_ratio_the_limits_would_pass_says_so_and_may_take_it_later() -> None:
    verdict = RATIO_CLUSTER.explain_node(pod("b", _burstable(10, 8, core_limit=20, gib_limit=24)), NodeName("one"))
    assert not verdict.feasible and not verdict.unresolvable
    assert verdict.reason == "no GPU here keeps the burstable limits within 1 x what the guaranteed shares leave free"


def test_a_request_that_does_not_fit_is_told_as_for_any_share_before_the_ratio() -> None:
    verdict = RATIO_CLUSTER.explain_node(pod("b", _burstable(20, 8, core_limit=30, gib_limit=10)), NodeName("full"))
    assert verdict.reason.startswith("no GPU has 20% core and 8Gi memory free")


@pytest.mark.parametrize(("core", "gib", "core_limit", "gib_limit"), [
    (10, 8, 20, 16), (10, 8, 20, 24), (10, 8, 100, 80), (20, 8, 30, 10), (5, 4, 5, 4), (60, 30, 60, 70),
])
def test_bulk_reasons_for_burstable_pods_equal_the_nodes_explained_alone(
    core: int, gib: int, core_limit: int, gib_limit: int
) -> None:
    request = pod("b", _burstable(core, gib, core_limit=core_limit, gib_limit=gib_limit))
    for verdict in RATIO_CLUSTER.filter(request):
        assert verdict == RATIO_CLUSTER.explain_node(request, verdict.node_name)
