"""A memory-only share (0% compute: no compute limit on the node) never shares a card with another pod's compute."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.device_request import Burst
from apis.request import DeviceRequest
from scheduler_plugin.core.api import NodeName, PodRequest, PodUID
from scheduler_plugin.core.defrag_planner import Candidate, Plan, plan_room
from scheduler_plugin.core.demand import demand_of
from scheduler_plugin.core.memory_only import is_memory_only, share_is_memory_only
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import GiB, gpu, info, node, pod, share, whole

#: (core percent, GiB, GPU indexes) held by one bound pod each.
Holder = tuple[int, int, tuple[int, ...]]


def memory_only(gib: int, cards: int = 1) -> DeviceRequest:
    return DeviceRequest(
        gpus=cards, core_percent=0, memory_bytes=gib * GiB, memory_ratio_percent=None, whole=False, source="koordinator"
    )


def _cluster(holders: list[Holder], *, devices: int = 8, node_name: str = "n1") -> Scheduler:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node(node_name, devices))
    scheduler.upsert_node_info(info(node_name))
    for n, (core, gib, gpus) in enumerate(holders):
        shares = tuple(GPUShare(i, f"GPU-{node_name}-{i}", core, gib * GiB, 0) for i in gpus)
        scheduler.add_pod(pod(f"holder-{n}"), NodeName(node_name), Allocation(gpus=shares))
    return scheduler


@dataclass(frozen=True)
class Case:
    name: str
    holders: list[Holder]
    pod: PodRequest
    #: the GPU indexes the pod may get; empty: it must be refused
    allowed: frozenset[int]
    #: words the refusal must hold
    reason: tuple[str, ...] = ()


ALL = tuple(range(8))
CASES = [
    Case(
        "memory only is refused where every card's compute is reserved (the review's case)",
        [(100, 40, (i,)) for i in ALL],
        pod("p", memory_only(10)),
        frozenset(),
        (
            "1 GPU share of 10Gi asks for GPU memory only",
            "no compute limit",
            "GPU 0: 100% core held, GPU 1: 100% core held, GPU 2: 100% core held and 5 more",
            f"ask for a compute share too ({names.GPU_CORE}",
        ),
    ),
    Case(
        "memory only is refused beside any compute at all, even 10%",
        [(10, 1, ALL)],
        pod("p", memory_only(10)),
        frozenset(),
        ("GPU 0: 10% core held",),
    ),
    Case(
        "memory only takes the one card without compute reservations",
        [(30, 10, (i,)) for i in range(7)],
        pod("p", memory_only(10)),
        frozenset({7}),
    ),
    Case(
        "memory only shares a card with other memory-only shares",
        [(0, 20, (0,)), *[(50, 10, (i,)) for i in range(1, 8)]],
        pod("p", memory_only(10)),
        frozenset({0}),
    ),
    Case(
        "memory only short of memory gets the plain reason, not the rule's",
        [(0, 60, ALL)],
        pod("p", memory_only(40)),
        frozenset(),
        ("no GPU has 0% core and 40Gi memory free",),
    ),
    Case(
        "compute is refused where every card with room holds a memory-only share",
        [(0, 10, tuple(range(7))), (100, 10, (7,))],
        pod("p", share(30, gib=10)),
        frozenset(),
        (
            "the GPUs here with room for 1 GPU share of 30% core and 10Gi (GPU 0, GPU 1, GPU 2 and 4 more)",
            "memory-only share",
            f"ask for {names.GPU_CORE} too",
        ),
    ),
    Case(
        "compute avoids the card holding a memory-only share",
        [(0, 10, (0,)), (90, 10, (1, 2, 3, 4, 5, 6))],
        pod("p", share(10, gib=10)),
        frozenset({1, 2, 3, 4, 5, 6, 7}),
    ),
    Case(
        "several compute cards count only cards without memory-only shares",
        [(0, 10, (0, 1, 2, 3, 4, 5))],
        pod("p", share(10, gib=10, cards=3)),
        frozenset(),
        ("(GPU 0, GPU 1, GPU 2 and 3 more)", "memory-only share"),
    ),
    Case(
        "whole GPUs are exclusive already",
        [(0, 10, (0, 1))],
        pod("p", whole(6)),
        frozenset(range(2, 8)),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_memory_only_and_compute_shares_keep_to_separate_cards(case: Case) -> None:
    scheduler = _cluster(case.holders)
    verdict = scheduler.filter(case.pod, [NodeName("n1")])[0]
    # The bulk reason (filter) and the one-by-one reason must be the same words.
    assert verdict == scheduler.explain_node(case.pod, NodeName("n1"))
    if not case.allowed:
        assert not verdict.feasible
        assert not verdict.unresolvable  # pods leaving the card make room
        for words in case.reason:
            assert words in verdict.reason, verdict.reason
        return
    assert verdict.feasible, verdict.reason
    allocation = scheduler.reserve(case.pod, NodeName("n1"))
    assert {share.minor for share in allocation.gpus} <= case.allowed


def test_a_memory_only_share_on_a_mig_instance_is_not_held_to_the_rule() -> None:
    """A MIG instance's compute is its own (hardware-isolated): a memory-only share may take one."""
    scheduler = Scheduler()
    gpus = [gpu("n1", 0, mig=[("1g.10gb", 10)]), gpu("n1", 1)]
    scheduler.upsert_node_devices(node("n1", gpus=gpus))
    scheduler.upsert_node_info(info("n1"))
    scheduler.add_pod(pod("trainer"), NodeName("n1"), Allocation(gpus=(GPUShare(1, "GPU-n1-1", 100, 10 * GiB, 0),)))
    allocation = scheduler.reserve(pod("p", memory_only(5)), NodeName("n1"))
    assert allocation.gpus[0].mig_uuid == "MIG-n1-0-0"
    # and the MIG share does not mark GPU 0 as holding a memory-only share
    assert not scheduler.state.mem_only_held.any()


def test_the_card_is_free_for_compute_again_once_the_memory_only_pod_leaves() -> None:
    scheduler = _cluster([(100, 10, (1,))], devices=2)
    first = pod("first", memory_only(10))
    assert {s.minor for s in scheduler.reserve(first, NodeName("n1")).gpus} == {0}
    assert not scheduler.filter(pod("compute", share(50, gib=10)), [NodeName("n1")])[0].feasible
    scheduler.unreserve(first.uid)
    assert scheduler.filter(pod("compute", share(50, gib=10)), [NodeName("n1")])[0].feasible
    assert not scheduler.state.mem_only_rows


BURST = Burst(core_percent=50, memory_bytes=10 * GiB, memory_ratio_percent=None)
MEMORY_BURST = Burst(core_percent=0, memory_bytes=20 * GiB, memory_ratio_percent=None)


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (memory_only(10), True),
        (share(0, ratio=50), True),
        (share(10, gib=10), False),
        (whole(1), False),
        (None, False),
        # a burst limit on compute caps it, so it is not "no limit"
        (DeviceRequest(1, 0, 10 * GiB, None, False, "koordinator", limit=BURST), False),
        (DeviceRequest(1, 0, 10 * GiB, None, False, "koordinator", limit=MEMORY_BURST), True),
    ],
)
def test_which_demands_run_with_no_compute_limit(device: DeviceRequest | None, expected: bool) -> None:
    assert is_memory_only(demand_of(pod("p", device))) is expected


@pytest.mark.parametrize(
    ("allocated", "expected"),
    [
        (GPUShare(0, "GPU-0", 0, GiB, 0), True),
        (GPUShare(0, "GPU-0", 20, GiB, 0), False),
        (GPUShare(0, "GPU-0", 0, GiB, 0, "MIG-0"), False),
        (GPUShare(0, "GPU-0", 0, GiB, 0, mig_profile="1g.10gb", mig_placement=0), False),
    ],
)
def test_which_allocated_shares_run_with_no_compute_limit(allocated: GPUShare, expected: bool) -> None:
    assert share_is_memory_only(allocated) is expected


def _mixed_cluster() -> Scheduler:
    scheduler = Scheduler()
    for name, holders in (
        ("mem-only", [(0, 10, (0, 1)), (60, 20, (2, 3))]),
        ("compute", [(30, 10, (0, 1, 2, 3))]),
        ("full", [(100, 10, (0, 1, 2, 3))]),
        ("empty", []),
        ("mixed-cards", [(0, 70, (0,)), (100, 70, (1,)), (0, 5, (2,))]),
    ):
        scheduler.upsert_node_devices(node(name, 4))
        scheduler.upsert_node_info(info(name))
        for n, (core, gib, gpus) in enumerate(holders):
            shares = tuple(GPUShare(i, f"GPU-{name}-{i}", core, gib * GiB, 0) for i in gpus)
            scheduler.add_pod(pod(f"{name}-holder-{n}"), NodeName(name), Allocation(gpus=shares))
    return scheduler


MIXED = _mixed_cluster()


@settings(max_examples=60, deadline=None)
@given(
    core=st.sampled_from([0, 10, 50, 100]),
    gib=st.sampled_from([1, 10, 50, 75]),
    cards=st.integers(1, 4),
)
def test_bulk_reasons_under_the_rule_equal_the_node_explained_alone(core: int, gib: int, cards: int) -> None:
    request = pod("p", share(core, gib=gib, cards=cards))
    for verdict in MIXED.filter(request, [NodeName(n) for n in sorted(MIXED.state.slot_of)]):
        assert verdict == MIXED.explain_node(request, verdict.node_name)


def test_defrag_clears_a_card_of_compute_for_a_memory_only_pod() -> None:
    """The planner's candidate sets know a memory-only share needs a card without compute."""
    scheduler = Scheduler()
    where: dict[PodUID, NodeName] = {}
    for name in ("n1", "n2"):
        scheduler.upsert_node_devices(node(name, 1))
        scheduler.upsert_node_info(info(name))
        trainer = pod(f"trainer-{name}", share(30, gib=10))
        scheduler.add_pod(trainer, NodeName(name), Allocation(gpus=(GPUShare(0, f"GPU-{name}-0", 30, 10 * GiB, 0),)))
        where[trainer.uid] = NodeName(name)
    pending = pod("inference", memory_only(10))
    assert scheduler.select(pending) is None
    candidates = {
        uid: Candidate(pod(f"trainer-{node_name}", share(30, gib=10)), node_name) for uid, node_name in where.items()
    }
    plan = plan_room(scheduler, pending, candidates, max_moves=1)
    assert isinstance(plan, Plan), plan
    (move,) = plan.moves
    assert move.from_node == plan.target and move.to_node != plan.target
