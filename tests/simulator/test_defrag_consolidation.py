"""The planner's consolidation question: which moves leave a node with no GPU pod, checked on the core."""

from __future__ import annotations

from scheduler_plugin.core.api import NodeName, PodUID
from scheduler_plugin.core.defrag_planner import Candidate, NoPlan, Plan, Refusal, plan_consolidation
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.replay import build_scheduler, pod_request
from scheduler_plugin.sim.trace import TraceNode, TracePod


def _pod(name: str, milli: int) -> TracePod:
    return TracePod(name=name, cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=milli)


def _cluster(placements: dict[str, tuple[str, int]], nodes: int = 3) -> tuple[Scheduler, dict[PodUID, Candidate]]:
    """Pods pinned to nodes as given (name -> (node, milli)); every pod a candidate."""
    gpu_nodes = [TraceNode(f"n{i}", cpu_milli=64000, memory_mib=65536, gpus=1, model="G2") for i in range(1, nodes + 1)]
    core = build_scheduler(gpu_nodes, policy="fgpu", seed=1, workload=None)
    candidates = {}
    for name, (node, milli) in placements.items():
        request = pod_request(_pod(name, milli))
        core.reserve(request, NodeName(node))
        core.confirm(request.uid)
        candidates[request.uid] = Candidate(request, NodeName(node))
    return core, candidates


def test_the_pods_of_a_light_node_are_placed_elsewhere_and_the_core_is_left_as_it_was() -> None:
    core, candidates = _cluster({"a": ("n1", 300), "b": ("n2", 300), "c": ("n2", 200)})
    before = core.node_views()
    plan = plan_consolidation(core, NodeName("n1"), candidates, max_moves=4)
    assert isinstance(plan, Plan)
    assert plan.pending is None and plan.target == "n1"
    assert [(m.key, m.from_node) for m in plan.moves] == [("trace/a", "n1")]
    assert plan.moves[0].to_node != "n1"
    assert core.node_views() == before


def test_a_pod_that_may_not_move_pins_the_node() -> None:
    core, candidates = _cluster({"a": ("n1", 300), "pinned": ("n1", 200)})
    del candidates[pod_request(_pod("pinned", 200)).uid]
    outcome = plan_consolidation(core, NodeName("n1"), candidates, max_moves=4)
    assert isinstance(outcome, NoPlan) and outcome.reason is Refusal.PINNED


def test_when_the_policy_would_put_a_pod_back_on_the_node_nothing_is_planned() -> None:
    # n2 is nearly full: the only place for `a` once evicted is n1 again.
    core, candidates = _cluster({"a": ("n1", 300), "full": ("n2", 800)}, nodes=2)
    outcome = plan_consolidation(core, NodeName("n1"), candidates, max_moves=4)
    assert isinstance(outcome, NoPlan) and outcome.reason is Refusal.SIMULATION_FAILED
    assert "back on n1" in outcome.detail[0]


def test_budgets_and_the_move_limit_hold() -> None:
    core, candidates = _cluster({"a": ("n1", 300), "b": ("n1", 200)})
    assert plan_consolidation(core, NodeName("n1"), candidates, max_moves=1) == NoPlan(Refusal.OVER_BUDGET)
    guarded = {uid: Candidate(c.request, c.node, ("ns/pdb",)) for uid, c in candidates.items()}
    assert plan_consolidation(core, NodeName("n1"), guarded, max_moves=4, allowances={"ns/pdb": 1}) == NoPlan(
        Refusal.OVER_BUDGET
    )
    assert isinstance(plan_consolidation(core, NodeName("n1"), guarded, max_moves=4, allowances={"ns/pdb": 2}), Plan)


def test_an_empty_node_needs_nothing() -> None:
    core, candidates = _cluster({"a": ("n1", 300)})
    assert plan_consolidation(core, NodeName("n3"), candidates, max_moves=4) == NoPlan(Refusal.NOTHING_TO_MOVE)

