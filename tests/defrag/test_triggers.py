"""The descheduler's trigger decisions, table-driven over plain data (scheduler_plugin/descheduler/triggers.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from scheduler_plugin.descheduler.triggers import (
    ConsolidationSettings,
    NodeLoad,
    Pending,
    RoomSettings,
    consolidation_due,
    make_room_for,
    nodes_to_empty,
)

ROOM = RoomSettings(pending_s=300, min_fragmentation=0.25)


@dataclass(frozen=True)
class RoomCase:
    pending: tuple[Pending, ...]
    fragmented: float
    idle: dict[str, int]
    targets: tuple[str, ...]
    reason: str = ""


ROOM_CASES = {
    "an old whole-GPU pod, fragmented idle GPU that would hold it: act for it": RoomCase(
        (Pending("a/train", 600, 1000),), 0.4, {"A100": 1500}, ("a/train",)
    ),
    "pending shorter than the threshold: nothing": RoomCase(
        (Pending("a/train", 299, 1000),), 0.9, {"A100": 1500}, (), "no GPU pod pending 300s"
    ),
    "exactly at the threshold counts": RoomCase((Pending("a/train", 300, 1000),), 0.25, {"A100": 1000}, ("a/train",)),
    "fragmentation under the threshold: nothing, and it says so": RoomCase(
        (Pending("a/train", 900, 1000),), 0.2, {"A100": 1500}, (), "20% of the idle GPU is fragmented"
    ),
    "the idle GPU would not hold it even in one piece: the cluster is full, moving cannot help": RoomCase(
        (Pending("a/train", 900, 2000),), 0.9, {"A100": 1500}, (), "cluster is full"
    ),
    "only idle GPU of an allowed model counts": RoomCase(
        (Pending("a/train", 900, 1000, frozenset({"H100"})),), 0.9, {"A100": 3000, "H100": 500}, (), "cluster is full"
    ),
    "oldest first; the idle pool is taken in turn, so a third pod it cannot also hold is left out": RoomCase(
        (Pending("a/young", 400, 1000), Pending("a/old", 800, 1000), Pending("a/mid", 600, 1000)),
        0.5,
        {"A100": 1200, "H100": 900},
        ("a/old", "a/mid"),
    ),
    "a pod asking no GPU share is no reason": RoomCase((Pending("a/cpu", 900, 0),), 0.9, {"A100": 1000}, (), "no GPU pod"),
    "no pending pod at all": RoomCase((), 0.9, {"A100": 1000}, (), "no GPU pod"),
}


@pytest.mark.parametrize("name", sorted(ROOM_CASES))
def test_make_room_for(name: str) -> None:
    case = ROOM_CASES[name]
    decision = make_room_for(case.pending, fragmented_of_idle=case.fragmented, idle_milli_by_model=case.idle, settings=ROOM)
    assert decision.targets == case.targets
    if case.reason:
        assert case.reason in decision.reason
    else:
        assert decision.reason == ""


@pytest.mark.parametrize(
    ("every_s", "now_s", "last_s", "due"),
    [
        (0, 10_000, None, False),  # the mode is off
        (3600, 5, None, True),  # on: the first cycle consolidates
        (3600, 3605, 5, True),
        (3600, 3604, 5, False),
    ],
)
def test_consolidation_is_due_every_period_only_when_the_mode_is_on(
    every_s: float, now_s: float, last_s: float | None, due: bool
) -> None:
    assert consolidation_due(now_s=now_s, last_s=last_s, settings=ConsolidationSettings(every_s=every_s)) is due


CONSOLIDATE = ConsolidationSettings(every_s=3600, max_occupancy=0.25, min_gpus=2)


@pytest.mark.parametrize(
    ("loads", "max_moves", "targets"),
    [
        # n2 holds fewer pods than n1; n3 is too full; n4 is empty already; n5 has a pinned pod;
        # n6 has one GPU only.
        (
            (
                NodeLoad("n1", 8, 1500, 3, 3),
                NodeLoad("n2", 8, 1000, 2, 2),
                NodeLoad("n3", 8, 4000, 2, 2),
                NodeLoad("n4", 8, 0, 0, 0),
                NodeLoad("n5", 8, 500, 2, 1),
                NodeLoad("n6", 1, 200, 1, 1),
            ),
            4,
            ("n2", "n1"),
        ),
        # More pods than a plan may move: left alone.
        ((NodeLoad("n1", 8, 1500, 5, 5),), 4, ()),
        # Ties on pod count: the less occupied per GPU first.
        ((NodeLoad("a", 8, 1600, 2, 2), NodeLoad("b", 4, 400, 2, 2)), 4, ("b", "a")),
        # Exactly at the occupancy limit counts.
        ((NodeLoad("n1", 4, 1000, 1, 1),), 4, ("n1",)),
    ],
)
def test_nodes_to_empty(loads: tuple[NodeLoad, ...], max_moves: int, targets: tuple[str, ...]) -> None:
    decision = nodes_to_empty(loads, max_moves=max_moves, settings=CONSOLIDATE)
    assert decision.targets == targets
    assert bool(decision.reason) == (not targets)
