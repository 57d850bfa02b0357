"""Defrag planning that honours node selectors / affinity and clears nodes short of CPU or memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fgpuctl.main import main as fgpuctl
from scheduler_plugin.core.api import LabelRequirement
from scheduler_plugin.sim.defrag import plan_defrag
from scheduler_plugin.sim.snapshot import (
    DisruptionBudget,
    PlacedPod,
    Snapshot,
    SnapshotError,
    snapshot_from_json,
    snapshot_to_json,
)
from tests.simulator.helpers import node, pod

TWO_GPUS = pod("pending", milli=1000, gpus=2, cpu=1000)
ZONES = {"a": {"zone": "x"}, "b": {"zone": "y"}, "c": {"zone": "z"}}


def moves_of(snapshot: Snapshot, pending: Any = TWO_GPUS, max_moves: int = 5) -> list[tuple[str, str, str]]:
    return [(m.pod, m.from_node, m.to_node) for m in plan_defrag(snapshot, pending=pending, max_moves=max_moves).moves]


def two_scattered(*, selector_a: dict[str, str] | None = None, selector_b: dict[str, str] | None = None) -> Snapshot:
    """Two 2-GPU nodes with one small share each: a 2-GPU pod fits once one small share moves."""
    return Snapshot(
        nodes=(node("a", gpus=2), node("b", gpus=2)),
        pods=(
            PlacedPod(pod("small-a", milli=300), "a", (0,), node_selector=selector_a or {}),
            PlacedPod(pod("small-b", milli=500), "b", (0,), node_selector=selector_b or {}),
        ),
        node_labels={"a": {"zone": "x"}, "b": {"zone": "y"}},
    )


def test_without_constraints_the_first_node_by_name_is_cleared() -> None:
    assert moves_of(two_scattered()) == [("small-a", "a", "b")]


def test_a_pod_whose_node_selector_matches_only_its_own_node_is_never_moved() -> None:
    plan = plan_defrag(two_scattered(selector_a={"zone": "x"}), pending=TWO_GPUS, max_moves=5)

    assert [(m.pod, m.from_node, m.to_node) for m in plan.moves] == [("small-b", "b", "a")]
    assert any("small-a fits on no other node" in line for line in plan.skipped)
    assert plan.after.pending_fit == 1


def test_when_every_blocker_is_held_by_its_selector_nothing_is_freed() -> None:
    plan = plan_defrag(two_scattered(selector_a={"zone": "x"}, selector_b={"zone": "y"}), pending=TWO_GPUS, max_moves=5)

    assert plan.moves == ()
    assert plan.after == plan.before
    assert len(plan.skipped) == 2


def three_nodes(affinity: tuple[tuple[LabelRequirement, ...], ...]) -> Snapshot:
    """a's small share is the only movable blocker; b and c each have one GPU left for it."""
    pinned = DisruptionBudget("fill", {"role": "fill"}, 0)
    return Snapshot(
        nodes=(node("a", gpus=2), node("b", gpus=2), node("c", gpus=2)),
        pods=(
            PlacedPod(pod("small-a", milli=300), "a", (0,), affinity=affinity),
            PlacedPod(pod("fill-b", milli=1000), "b", (1,), {"role": "fill"}),
            PlacedPod(pod("fill-c", milli=1000), "c", (1,), {"role": "fill"}),
        ),
        budgets=(pinned,),
        node_labels=ZONES,
    )


@pytest.mark.parametrize("target", ["b", "c"])
@pytest.mark.parametrize("by", ["label", "node name"])
def test_a_pod_whose_affinity_allows_one_other_node_moves_only_there(target: str, by: str) -> None:
    allowed = (
        LabelRequirement("zone", "In", ("x", ZONES[target]["zone"]))
        if by == "label"
        else LabelRequirement("metadata.name", "In", ("a", target))
    )

    plan = plan_defrag(three_nodes(((allowed,),)), pending=TWO_GPUS, max_moves=5)

    assert [(m.pod, m.from_node, m.to_node) for m in plan.moves] == [("small-a", "a", target)]
    assert plan.after.pending_fit == 1


def test_affinity_terms_are_alternatives_and_requirements_inside_a_term_all_apply() -> None:
    # Term 1 allows no node but a (zone x and not a); term 2 allows c only.
    terms = (
        (LabelRequirement("zone", "In", ("x",)), LabelRequirement("metadata.name", "NotIn", ("a",))),
        (LabelRequirement("zone", "Exists"), LabelRequirement("zone", "NotIn", ("x", "y"))),
    )
    assert moves_of(three_nodes(terms)) == [("small-a", "a", "c")]


def cpu_blocked(*, hog_labels: dict[str, str] | None = None, budgets: tuple[DisruptionBudget, ...] = ()) -> Snapshot:
    """a's GPU is free but a CPU-only pod holds its CPU; b's GPU is taken by a pinned pod, its CPU free."""
    return Snapshot(
        nodes=(node("a", gpus=1, cpu=32000), node("b", gpus=1, cpu=64000)),
        pods=(
            PlacedPod(pod("hog", cpu=30000), "a", (), hog_labels or {}),
            PlacedPod(pod("gpu-b", milli=1000), "b", (0,), {"role": "fill"}),
        ),
        budgets=(DisruptionBudget("fill", {"role": "fill"}, 0), *budgets),
    )


def test_a_node_short_only_of_cpu_is_cleared_by_moving_its_cpu_only_pod() -> None:
    pending = pod("pending", milli=1000, cpu=8000)

    plan = plan_defrag(cpu_blocked(), pending=pending, max_moves=5)

    assert plan.before.pending_fit == 0
    assert [(m.pod, m.from_node, m.to_node, m.gpus) for m in plan.moves] == [("hog", "a", "b", ())]
    assert plan.opened == ("a",)
    assert plan.after.pending_fit == 1


def test_a_node_short_only_of_memory_is_cleared_too() -> None:
    snapshot = Snapshot(
        nodes=(node("a", gpus=1, memory_mib=65536), node("b", gpus=1, memory_mib=262144)),
        pods=(
            PlacedPod(pod("cache", cpu=100, memory_mib=60000), "a", ()),
            PlacedPod(pod("gpu-b", milli=1000), "b", (0,), {"role": "fill"}),
        ),
        budgets=(DisruptionBudget("fill", {"role": "fill"}, 0),),
    )
    assert moves_of(snapshot, pod("pending", milli=1000, cpu=0, memory_mib=16384)) == [("cache", "a", "b")]


def test_a_budget_pins_the_cpu_only_pod_too() -> None:
    pinned = cpu_blocked(hog_labels={"app": "hog"}, budgets=(DisruptionBudget("hog", {"app": "hog"}, 0),))
    assert moves_of(pinned, pod("pending", milli=1000, cpu=8000)) == []


def test_the_move_budget_counts_cpu_blockers() -> None:
    assert moves_of(cpu_blocked(), pod("pending", milli=1000, cpu=8000), max_moves=0) == []


def test_a_budget_allowing_one_disruption_never_lets_two_of_its_pods_move_together() -> None:
    def snapshot(allowed: int) -> Snapshot:
        return Snapshot(
            nodes=(node("a", gpus=1, cpu=32000), node("b", gpus=1, cpu=64000)),
            pods=(
                PlacedPod(pod("batch-0", cpu=15000), "a", (), {"app": "batch"}),
                PlacedPod(pod("batch-1", cpu=15000), "a", (), {"app": "batch"}),
                PlacedPod(pod("gpu-b", milli=1000), "b", (0,), {"role": "fill"}),
            ),
            budgets=(DisruptionBudget("fill", {"role": "fill"}, 0), DisruptionBudget("batch", {"app": "batch"}, allowed)),
        )

    pending = pod("pending", milli=1000, cpu=20000)  # needs both batch pods gone
    assert moves_of(snapshot(1), pending) == []
    assert sorted(moves_of(snapshot(2), pending)) == [("batch-0", "a", "b"), ("batch-1", "a", "b")]


def test_the_pod_giving_back_most_of_the_shortfall_moves_alone() -> None:
    snapshot = Snapshot(
        nodes=(node("a", gpus=1, cpu=32000), node("b", gpus=1, cpu=64000)),
        pods=(
            PlacedPod(pod("little", cpu=2000), "a", ()),
            PlacedPod(pod("large", cpu=24000), "a", ()),
            PlacedPod(pod("gpu-b", milli=1000), "b", (0,), {"role": "fill"}),
        ),
        budgets=(DisruptionBudget("fill", {"role": "fill"}, 0),),
    )
    assert moves_of(snapshot, pod("pending", milli=1000, cpu=10000)) == [("large", "a", "b")]


def test_labels_selectors_and_affinity_round_trip_through_json() -> None:
    snapshot = three_nodes(((LabelRequirement("zone", "In", ("x", "z")), LabelRequirement("gen", "Gt", ("3",))),))
    snapshot = Snapshot(
        nodes=snapshot.nodes,
        pods=(*snapshot.pods, PlacedPod(pod("sel", cpu=10), "b", (), node_selector={"zone": "y"})),
        budgets=snapshot.budgets,
        node_labels=snapshot.node_labels,
    )
    data = json.loads(json.dumps(snapshot_to_json(snapshot)))

    assert data["nodes"][0]["labels"] == {"zone": "x"}
    assert data["pods"][0]["affinity"] == [
        [{"key": "zone", "operator": "In", "values": ["x", "z"]}, {"key": "gen", "operator": "Gt", "values": ["3"]}]
    ]
    assert snapshot_from_json(data) == snapshot


def with_pod(**extra: Any) -> dict[str, Any]:
    return {
        "nodes": [{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": 1}],
        "pods": [{"name": "p", "node": "a", "cpu_milli": 1, "memory_mib": 1, "num_gpu": 0, "gpu_milli": 0, **extra}],
    }


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (
            with_pod(affinity=[[{"key": "zone", "operator": "Within", "values": ["x"]}]]),
            "pods[0] (p): affinity[0][0]: operator = 'Within' is not a node affinity operator; use one of In, NotIn",
        ),
        (with_pod(affinity=[[{"key": "zone", "operator": "In"}]]), "affinity[0][0]: operator In needs at least one value"),
        (with_pod(affinity=[[{"key": "zone", "operator": "NotIn", "values": []}]]), "operator NotIn needs at least one value"),
        (
            with_pod(affinity=[[{"key": "zone", "operator": "Exists", "values": ["x"]}]]),
            "operator Exists takes no values, got ['x']; drop \"values\"",
        ),
        (with_pod(affinity=[[{"key": "gen", "operator": "Gt", "values": ["three"]}]]), "needs exactly one integer value"),
        (with_pod(affinity=[[{"operator": "Exists"}]]), "affinity[0][0]: key = None; name the node label"),
        (with_pod(affinity=[[{"key": "z", "operator": "Exists", "value": "x"}]]), "unknown field(s) 'value'"),
        (with_pod(affinity=[{"key": "zone", "operator": "Exists"}]), "affinity[0] = {'key': 'zone'"),
        (with_pod(affinity={"zone": "x"}), "field 'affinity' = {'zone': 'x'} is not a list of terms"),
        (with_pod(node_selector=["zone=x"]), "pods[0] (p): field 'node_selector' = ['zone=x'] is not an object"),
        (with_pod(node_selector={"zone": 3}), "field 'node_selector' has 'zone': 3"),
        (
            {"nodes": [{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": 1, "labels": {"gen": 4}}]},
            "nodes[0] (a): field 'labels' has 'gen': 4; keys must be non-empty strings and values strings",
        ),
    ],
)
def test_a_bad_selector_or_affinity_names_the_entry_field_value_and_fix(broken: dict[str, Any], message: str) -> None:
    with pytest.raises(SnapshotError) as caught:
        snapshot_from_json(broken)
    assert message in str(caught.value)


def test_defrag_plan_cli_reports_a_pod_held_by_its_selector(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snapshot_to_json(two_scattered(selector_a={"zone": "x"}))))

    assert fgpuctl(["defrag-plan", "--snapshot", str(path), "--gpus", "2", "--cpu", "1000"]) == 0

    out = capsys.readouterr().out
    assert "move small-b: b -> a" in out
    assert "skipped a: blocking pod small-a fits on no other node" in out


def test_defrag_plan_cli_rejects_a_bad_affinity_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(with_pod(affinity=[[{"key": "zone", "operator": "in", "values": ["x"]}]])))

    assert fgpuctl(["defrag-plan", "--snapshot", str(path)]) == 2

    assert "pods[0] (p): affinity[0][0]: operator = 'in'" in capsys.readouterr().err
