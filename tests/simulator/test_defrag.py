from __future__ import annotations

import json
from pathlib import Path

import pytest

from fgpuctl.main import main as fgpuctl
from scheduler_plugin.sim.defrag import moved_snapshot, plan_defrag
from scheduler_plugin.sim.snapshot import (
    DisruptionBudget,
    PlacedPod,
    Snapshot,
    SnapshotError,
    snapshot_from_json,
    snapshot_to_json,
)
from tests.simulator.helpers import NODES_CSV, PODS_CSV, node, pod

TWO_GPUS = pod("pending", milli=1000, gpus=2, cpu=1000)


def scattered() -> Snapshot:
    """Two 2-GPU nodes, each with one small share on GPU 0: no node has 2 free GPUs."""
    return Snapshot(
        nodes=(node("a", gpus=2), node("b", gpus=2)),
        pods=(
            PlacedPod(pod("small-a", milli=300), "a", (0,), {"app": "web"}),
            PlacedPod(pod("small-b", milli=500), "b", (0,), {"app": "db"}),
        ),
    )


def test_one_move_frees_a_whole_node_for_a_two_gpu_pod() -> None:
    plan = plan_defrag(scattered(), pending=TWO_GPUS, max_moves=3)
    assert plan.before.pending_fit == 0
    assert plan.after.pending_fit == 1
    assert len(plan.moves) == 1
    (move,) = plan.moves
    assert (move.from_node, move.to_node) in {("a", "b"), ("b", "a")}
    assert plan.after.free_whole_gpus >= plan.before.free_whole_gpus
    assert plan.after.frag_pct <= plan.before.frag_pct


def test_a_disruption_budget_pins_its_pods() -> None:
    snapshot = scattered()
    pinned = Snapshot(
        nodes=snapshot.nodes,
        pods=snapshot.pods,
        budgets=(DisruptionBudget("web", {"app": "web"}, 0), DisruptionBudget("db", {"app": "db"}, 0)),
    )
    plan = plan_defrag(pinned, pending=TWO_GPUS, max_moves=3)
    assert plan.moves == ()
    assert plan.after.pending_fit == 0


def test_the_budget_of_moves_is_respected() -> None:
    assert plan_defrag(scattered(), pending=TWO_GPUS, max_moves=0).moves == ()


def test_no_move_is_proposed_when_the_blocking_pods_fit_nowhere_else() -> None:
    # Both nodes' GPU 0 are nearly full: neither small pod fits on the other node.
    snapshot = Snapshot(
        nodes=(node("a", gpus=2), node("b", gpus=2)),
        pods=(
            PlacedPod(pod("big-a", milli=800), "a", (0,)),
            PlacedPod(pod("big-b", milli=800), "b", (0,)),
            PlacedPod(pod("fill-a", milli=1000), "a", (1,)),
            PlacedPod(pod("fill-b", milli=1000), "b", (1,)),
        ),
    )
    plan = plan_defrag(snapshot, pending=pod("pending", milli=1000, cpu=1000), max_moves=5)
    assert plan.moves == ()
    assert plan.after == plan.before


def test_applying_the_plan_gives_a_cluster_where_the_pending_pod_fits() -> None:
    plan = plan_defrag(scattered(), pending=TWO_GPUS, max_moves=3)
    after = moved_snapshot(scattered(), plan)
    assert plan_defrag(after, pending=TWO_GPUS, max_moves=0).before.pending_fit == 1


def test_snapshots_round_trip_through_json() -> None:
    snapshot = scattered()
    assert snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snapshot)))) == snapshot


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ({"nodes": []}, "'nodes' is empty"),
        ({"nodes": [{"name": "a", "cpu_milli": "x", "memory_mib": 1, "gpus": 1}]}, "'cpu_milli' = 'x' is not an integer"),
        (
            {
                "nodes": [{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": 1}],
                "pods": [{"name": "p", "node": "zz", "cpu_milli": 1, "memory_mib": 1, "num_gpu": 0, "gpu_milli": 0}],
            },
            "node 'zz' is not in 'nodes'",
        ),
        (
            {
                "nodes": [{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": 1}],
                "pods": [
                    {"name": "p", "node": "a", "cpu_milli": 1, "memory_mib": 1, "num_gpu": 1, "gpu_milli": 500, "gpus": [3]}
                ],
            },
            "must list 1 GPU index(es) of node a",
        ),
    ],
)
def test_a_bad_snapshot_names_the_entry_and_field(broken: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError) as caught:
        snapshot_from_json(broken)
    assert message in str(caught.value)


def test_defrag_plan_cli_on_a_snapshot_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snapshot_to_json(scattered())))
    code = fgpuctl(["defrag-plan", "--snapshot", str(path), "--gpus", "2", "--cpu", "1000", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["before"]["pending_fit"] == 0 and report["after"]["pending_fit"] == 1
    assert len(report["moves"]) == 1 and set(report["moves"][0]) == {"pod", "from", "to", "gpus"}


def test_defrag_plan_cli_plans_on_a_trace_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "replay.json"
    code = fgpuctl(
        [
            "defrag-plan", "--nodes", str(NODES_CSV), "--pods", str(PODS_CSV), "--arrived", "80",
            "--gpus", "8", "--write-snapshot", str(saved),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "pending pods fit" in out and "fragmentation %" in out
    assert json.loads(saved.read_text())["nodes"]


def test_defrag_plan_cli_rejects_a_bad_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert fgpuctl(["defrag-plan", "--nodes", str(NODES_CSV), "--pods", str(PODS_CSV), "--gpus", "2", "--gpu-milli", "500"]) == 2
    assert "--gpu-milli 500" in capsys.readouterr().err
