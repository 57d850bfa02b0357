"""The planner both defragmenters drive: it chooses moves, simulates them on the core, and changes nothing."""

from __future__ import annotations

from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.defrag_planner import Candidate, NodeOutcome, NoPlan, Plan, Refusal, plan_room
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.replay import build_scheduler, place, pod_request
from scheduler_plugin.sim.trace import TraceNode, TracePod

NODES = [TraceNode(f"n{i}", cpu_milli=64000, memory_mib=65536, gpus=1, model="G2") for i in (1, 2)]


def _pod(name: str, milli: int) -> TracePod:
    return TracePod(name=name, cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=milli)


def _fragmented() -> tuple[Scheduler, dict[str, NodeName]]:
    """Each GPU holds one 0.3 pod: 1.4 GPU free in two pieces."""
    core = build_scheduler(NODES, policy="fgpu", seed=1, workload=None)
    where = {}
    for name in ("big1", "big2", "small1", "small2"):
        node = place(core, _pod(name, 600 if name.startswith("big") else 300))
        assert node is not None
        where[name] = node
    for name in ("big1", "big2"):
        core.remove_pod(pod_request(_pod(name, 600)).uid)
    return core, where


def _candidates(core: Scheduler, where: dict[str, NodeName], budgets: tuple[str, ...] = ()) -> dict:  # type: ignore[type-arg]
    return {
        pod_request(_pod(n, 300)).uid: Candidate(pod_request(_pod(n, 300)), where[n], budgets)
        for n in ("small1", "small2")
    }


def test_one_move_makes_room_and_the_core_is_left_as_it_was() -> None:
    core, where = _fragmented()
    before = core.node_views()
    pending = pod_request(_pod("whole", 1000))
    plan = plan_room(core, pending, _candidates(core, where), max_moves=2)
    assert isinstance(plan, Plan)
    assert len(plan.moves) == 1
    move = plan.moves[0]
    assert move.from_node == plan.target and move.to_node != plan.target
    assert core.node_views() == before
    assert core.select(pending) is None


def test_a_disruption_budget_with_no_room_forbids_the_moves() -> None:
    core, where = _fragmented()
    pending = pod_request(_pod("whole", 1000))
    outcome = plan_room(core, pending, _candidates(core, where, ("ns/pdb",)), max_moves=2, allowances={"ns/pdb": 0})
    assert outcome == NoPlan(Refusal.OVER_BUDGET, causes=(NodeOutcome.OVER_BUDGET,) * 2)  # one per node
    allowed = plan_room(core, pending, _candidates(core, where, ("ns/pdb",)), max_moves=2, allowances={"ns/pdb": 1})
    assert isinstance(allowed, Plan)


def test_pods_that_may_not_move_are_never_planned() -> None:
    core, _where = _fragmented()
    pending = pod_request(_pod("whole", 1000))
    assert plan_room(core, pending, {}, max_moves=2) == NoPlan(Refusal.NO_CANDIDATE_NODE)


def test_a_pod_that_fits_already_needs_no_plan() -> None:
    core, where = _fragmented()
    assert plan_room(core, pod_request(_pod("tiny", 100)), _candidates(core, where), max_moves=2) == NoPlan(
        Refusal.FITS_ALREADY
    )


def test_the_node_rate_limit_keeps_the_planner_off_a_node() -> None:
    core, where = _fragmented()
    pending = pod_request(_pod("whole", 1000))
    left = {NodeName("n1"): 0, NodeName("n2"): 0}
    assert plan_room(core, pending, _candidates(core, where), max_moves=2, node_moves_left=left) == NoPlan(
        Refusal.NO_CANDIDATE_NODE
    )


def test_planning_teaches_the_policies_nothing_while_real_placements_still_count() -> None:
    core, where = _fragmented()
    seen: list[object] = []
    learn = core.node_policy.pod_added

    def counting(demand: object) -> None:
        seen.append(demand)
        learn(demand)  # type: ignore[arg-type]

    core.node_policy.pod_added = counting  # type: ignore[method-assign]
    plan = plan_room(core, pod_request(_pod("whole", 1000)), _candidates(core, where), max_moves=2)
    during = len(seen)
    place(core, _pod("later", 200))

    assert isinstance(plan, Plan)
    assert during == 0  # trial reservations and the moved pods put back are not new pods
    assert len(seen) == 1
