"""Where the planner searches: nodes that can never hold the pending pod, which pods it moves, in which order.

Each case is a small cluster the planner got wrong (or could only get right with more tries)
before: `max_tries=1` makes the first blocker set it ranks the one that must work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from scheduler_plugin.core.api import NodeName, PodUID
from scheduler_plugin.core.defrag_planner import Candidate, NodeOutcome, NoPlan, Plan, Refusal, plan_room
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.replay import build_scheduler, pod_request
from scheduler_plugin.sim.trace import TraceNode, TracePod


@dataclass(frozen=True)
class Placed:
    node: str
    milli: int
    #: GPU models the pod may use; empty = any
    models: tuple[str, ...] = ()
    movable: bool = True
    gpus: int = 1


@dataclass(frozen=True)
class Case:
    nodes: tuple[TraceNode, ...]
    placed: dict[str, Placed]
    pending: TracePod
    #: (pod, from, to) in the order the plan evicts them; () = no plan
    moves: tuple[tuple[str, str, str], ...]
    target: str = ""
    policy: str = "fgpu"
    causes: tuple[NodeOutcome, ...] = field(default=())


def _node(name: str, *, gpus: int = 1, cpu: int = 64000, model: str = "G2") -> TraceNode:
    return TraceNode(name, cpu_milli=cpu, memory_mib=262144, gpus=gpus, model=model)


def _pod(name: str, milli: int, *, gpus: int = 1, cpu: int = 1000, models: tuple[str, ...] = ()) -> TracePod:
    return TracePod(name=name, cpu_milli=cpu, memory_mib=1024, num_gpu=gpus, gpu_milli=milli, gpu_spec=models)


CASES = {
    # a-small has the fewest pods in the way but too little CPU for the pending pod ever: it is not
    # tried; b-big is, and its two pods go to a-small's GPUs.
    "a node short of CPU for good is skipped (multi-GPU pending pod)": Case(
        nodes=(_node("a-small", gpus=2, cpu=8000), _node("b-big", gpus=2, cpu=64000)),
        placed={"s": Placed("a-small", 300), "b1": Placed("b-big", 300), "b2": Placed("b-big", 300)},
        pending=_pod("pending", 1000, gpus=2, cpu=16000),
        moves=(("b1", "b-big", "a-small"), ("b2", "b-big", "a-small")),
        target="b-big",
    ),
    # Either pod on n1 alone makes room; the larger one may use G2 only and n2 is a T4: the planner
    # moves the one free to use any model.
    "the pod free to use any model moves, not the larger one held to a model": Case(
        nodes=(_node("n1", model="G2"), _node("n2", model="T4")),
        placed={"held": Placed("n1", 450, ("G2",)), "free": Placed("n1", 400), "pin": Placed("n2", 550, movable=False)},
        pending=_pod("pending", 550),
        moves=(("free", "n1", "n2"),),
        target="n1",
    ),
    # Both pods must leave n1; spread puts the first one scheduled on the emptiest GPU. The largest
    # first would take n2, the only other G2; the pod held to G2 is scheduled first, so it gets it.
    "the moved pod held to a model is scheduled again first": Case(
        nodes=(_node("n1"), _node("n2"), _node("n3", model="T4")),
        placed={
            "big": Placed("n1", 600),
            "held": Placed("n1", 300, ("G2",)),
            "pin2": Placed("n2", 300, movable=False),
            "pin3": Placed("n3", 350, movable=False),
        },
        pending=_pod("pending", 950),
        moves=(("held", "n1", "n2"), ("big", "n1", "n3")),
        target="n1",
        policy="spread",
    ),
    # Both pods must leave n1. Spread puts the first one scheduled on the emptiest GPU (n2): the
    # model-held pod first leaves no room for the 0.6 pod; the retry schedules the 0.6 pod first,
    # which leaves n3 for the other.
    "the moved pods are scheduled again in an order that places all of them": Case(
        nodes=(_node("n1"), _node("n2"), _node("n3")),
        placed={
            "big": Placed("n1", 600),
            "held": Placed("n1", 300, ("G2",)),
            "pin2": Placed("n2", 400, movable=False),
            "pin3": Placed("n3", 650, movable=False),
        },
        pending=_pod("pending", 950),
        moves=(("big", "n1", "n2"), ("held", "n1", "n3")),
        target="n1",
        policy="spread",
    ),
    # No other node: the moved pod goes back to the node's other GPU, which the pinned pod shares.
    "a moved pod may go back to another GPU of the same node": Case(
        nodes=(_node("n1", gpus=2),),
        placed={"x": Placed("n1", 500), "pin": Placed("n1", 400, movable=False)},
        pending=_pod("pending", 1000),
        moves=(("x", "n1", "n1"),),
        target="n1",
    ),
    # Nothing else holds a G2 pod: the only blocker set fails, and says why.
    "no plan when the moved pod fits nowhere, with the cause": Case(
        nodes=(_node("n1", model="G2"), _node("n2", model="T4")),
        placed={"held": Placed("n1", 600, ("G2",)), "pin": Placed("n2", 600, movable=False)},
        pending=_pod("pending", 700),
        moves=(),
        causes=(NodeOutcome.MOVED_POD_FITS_NOWHERE,),
    ),
}


def _cluster(case: Case) -> tuple[Scheduler, dict[PodUID, Candidate]]:
    core = build_scheduler(case.nodes, policy=case.policy, seed=1, workload=None)
    candidates = {}
    # Larger pods first, so that the core's GPU choice puts each where the case says it is.
    for name, placed in sorted(case.placed.items(), key=lambda item: -item[1].milli):
        request = pod_request(_pod(name, placed.milli, gpus=placed.gpus, models=placed.models))
        core.reserve(request, NodeName(placed.node))
        core.confirm(request.uid)
        if placed.movable:
            candidates[request.uid] = Candidate(request, NodeName(placed.node))
    return core, candidates


@pytest.mark.parametrize("name", list(CASES))
def test_the_planner_finds_the_plan_that_works_at_its_first_try(name: str) -> None:
    case = CASES[name]
    core, candidates = _cluster(case)
    before = core.node_views()
    pending = pod_request(case.pending)
    assert core.select(pending) is None, "the case must start with the pending pod blocked"

    outcome = plan_room(core, pending, candidates, max_moves=4, max_tries=1)

    assert core.node_views() == before
    if not case.moves:
        assert isinstance(outcome, NoPlan)
        assert outcome.reason == Refusal.SIMULATION_FAILED
        assert outcome.causes == case.causes
        return
    assert isinstance(outcome, Plan), outcome
    assert [(m.key.split("/")[-1], m.from_node, m.to_node) for m in outcome.moves] == list(case.moves)
    assert outcome.target == case.target
    assert outcome.causes == case.causes


def test_the_plan_replayed_in_its_order_places_every_pod() -> None:
    """What the drivers do with a plan (evict in order, the pending pod, then the copies in order) works."""
    case = CASES["the moved pods are scheduled again in an order that places all of them"]
    core, candidates = _cluster(case)
    pending = pod_request(case.pending)
    plan = plan_room(core, pending, candidates, max_moves=4)
    assert isinstance(plan, Plan)
    for move in plan.moves:
        core.remove_pod(move.uid)
    assert core.select(pending) == plan.target
    core.reserve(pending, plan.target)
    for move in plan.moves:
        request = candidates[move.uid].request
        assert core.select(request) == move.to_node
        core.reserve(request, move.to_node)
