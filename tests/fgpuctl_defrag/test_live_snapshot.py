"""Turning live rows and PodDisruptionBudgets into the planner's snapshot."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apis.devices import GPUInfo
from fgpuctl.cluster_state import GPURow, NodeRow, PodShare
from fgpuctl.live_snapshot import IN_FLIGHT, LiveStateError, budget_from_pdb, snapshot_from_scheduler
from scheduler_plugin.sim.defrag import plan_defrag
from scheduler_plugin.sim.snapshot import snapshot_from_json, snapshot_to_json
from scheduler_plugin.sim.trace import TracePod

GiB = 1024**3
WHOLE = TracePod(name="pending", cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=1000)


def gpu(index: int, *pods: PodShare, healthy: bool = True, external: bool = False) -> GPURow:
    return GPURow(
        device=GPUInfo(
            uuid=f"GPU-{index}", minor=index, index=index, model="NVIDIA H100", model_label="H100",
            memory_bytes=80 * GiB, healthy=healthy,
        ),
        allocated_core_percent=sum(p.core_percent for p in pods),
        allocated_memory_bytes=sum(p.memory_bytes for p in pods), held_externally=external, pods=pods,
    )


def share(name: str, core: int, memory_gib: int, *, assumed: bool = False) -> PodShare:
    return PodShare("ns", name, f"uid-{name}", core, memory_gib * GiB, assumed)


def test_a_share_counts_as_the_larger_of_its_core_and_its_memory_fraction() -> None:
    rows = [NodeRow("n1", "", "", (gpu(0, share("a", 10, 60)), gpu(1, share("b", 40, 8))))]

    pods = {p.pod.name: p for p in snapshot_from_scheduler(rows).snapshot.pods}

    assert (pods["ns/a"].pod.gpu_milli, pods["ns/b"].pod.gpu_milli) == (750, 400)
    assert pods["ns/a"].pod.gpu_spec == ("H100",) and pods["ns/a"].gpus == (0,)


def test_unhealthy_and_externally_held_gpus_take_no_pending_pod() -> None:
    rows = [NodeRow("n1", "", "", (gpu(0, healthy=False), gpu(1, external=True), gpu(2)))]

    snapshot = snapshot_from_scheduler(rows).snapshot
    plan = plan_defrag(snapshot, pending=WHOLE, max_moves=3)

    assert snapshot.unusable_gpus == {"n1": (0, 1)}
    assert plan.before.pending_fit == 1 and plan.before.free_whole_gpus == 1
    assert snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snapshot)))) == snapshot


def test_a_pod_still_being_bound_never_moves() -> None:
    rows = [
        NodeRow("n1", "", "", (gpu(0, share("binding", 20, 8, assumed=True)),)),
        NodeRow("n2", "", "", (gpu(0, share("settled", 20, 8)),)),
    ]

    snapshot = snapshot_from_scheduler(rows).snapshot
    plan = plan_defrag(snapshot, pending=WHOLE, max_moves=3)

    assert [b.name for b in snapshot.budgets] == [IN_FLIGHT]
    assert [(m.pod, m.to_node) for m in plan.moves] == [("ns/settled", "n1")]


def pods_with(*labels: dict[str, str], namespace: str = "web") -> dict[str, dict[str, Any]]:
    return {
        f"u{i}": {"metadata": {"uid": f"u{i}", "name": f"p{i}", "namespace": namespace, "labels": dict(found)}}
        for i, found in enumerate(labels)
    }


def pdb_object(spec: dict[str, Any], *, status: dict[str, Any] | None = None, generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "b", "namespace": "web", "generation": generation}, "spec": spec, "status": status or {}}


def test_a_budget_covers_the_pods_its_selector_and_namespace_pick() -> None:
    pods = {**pods_with({"app": "web", "tier": "a"}, {"app": "web", "tier": "b"}, {"app": "db"}),
            **{"x": {"metadata": {"uid": "x", "name": "other", "namespace": "elsewhere", "labels": {"app": "web"}}}}}
    names = {uid: f"web/{uid}" for uid in pods}
    spec = {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"},
                                              "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}}

    budget = budget_from_pdb(pdb_object(spec), pods=pods, names_by_uid=names)

    assert budget.name == "web/b" and budget.pods == frozenset({"web/u0"}) and budget.max_unavailable == 1


@pytest.mark.parametrize(
    ("spec", "status", "allowed"),
    [
        ({"minAvailable": "50%"}, None, 2),  # 4 selected, ceil(2) must stay
        ({"minAvailable": 3}, None, 1),
        ({"maxUnavailable": "30%"}, None, 2),  # ceil(1.2)
        ({}, None, 0),
        ({"maxUnavailable": 3}, {"disruptionsAllowed": 1, "observedGeneration": 1}, 1),
        ({"maxUnavailable": 3}, {"disruptionsAllowed": 0, "observedGeneration": 0}, 3),  # status is stale
    ],
)
def test_how_many_covered_pods_may_move(spec: dict[str, Any], status: dict[str, Any] | None, allowed: int) -> None:
    pods = pods_with(*[{"app": "web"}] * 4)
    full = {**spec, "selector": {"matchLabels": {"app": "web"}}}

    budget = budget_from_pdb(pdb_object(full, status=status), pods=pods, names_by_uid={})

    assert budget.max_unavailable == allowed


def test_a_null_selector_covers_no_pod() -> None:
    budget = budget_from_pdb(pdb_object({"maxUnavailable": 0}), pods=pods_with({"app": "web"}), names_by_uid={"u0": "web/p0"})

    assert budget.pods == frozenset()


def test_a_malformed_budget_is_named_with_its_field() -> None:
    with pytest.raises(LiveStateError, match=r"PodDisruptionBudget web/b: spec.minAvailable = 'half' .* percentage"):
        budget_from_pdb(pdb_object({"minAvailable": "half", "selector": {}}), pods={}, names_by_uid={})
