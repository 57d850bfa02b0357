"""The churn replay: pods arrive and leave in time, wait FIFO, and the defragmenter moves them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fgpuctl.main import main
from scheduler_plugin.sim.churn import (
    ChurnSettings,
    TimedPod,
    churn_replay,
    read_lifetimes,
    scale_cluster,
    timed_pods,
)
from scheduler_plugin.sim.trace import TraceError, TraceNode, TracePod

TWO_NODES = [TraceNode(f"n{i}", cpu_milli=64000, memory_mib=65536, gpus=1, model="G2") for i in (1, 2)]


def _pod(name: str, milli: int, *, gpus: int = 1) -> TracePod:
    return TracePod(name=name, cpu_milli=1000, memory_mib=1024, num_gpu=gpus, gpu_milli=milli)


def _fragmented() -> list[TimedPod]:
    """Two 0.6 pods and two 0.3 pods fill both GPUs; the 0.6 pods leave at 10 s, so 0.7 + 0.7 is free
    in two pieces when a whole-GPU pod arrives at 20 s; the 0.3 pods stay two hours."""
    return [
        TimedPod(_pod("a-big1", 600), 0.0, 10.0),
        TimedPod(_pod("a-big2", 600), 1.0, 9.0),
        TimedPod(_pod("b-small1", 300), 2.0, 7200.0),
        TimedPod(_pod("b-small2", 300), 3.0, 7200.0),
        TimedPod(_pod("c-whole", 1000), 20.0, 100.0),
    ]


def test_a_pod_that_fits_nowhere_waits_for_a_departure_and_its_wait_is_counted() -> None:
    pods = [TimedPod(_pod("first", 1000), 0.0, 3600.0), TimedPod(_pod("second", 1000), 0.0, 60.0)]
    result = churn_replay(nodes=TWO_NODES[:1], pods=pods, settings=ChurnSettings(policy="fgpu"))
    assert result.gpu_pods_waited == 1
    assert result.pending_gpu_hours == pytest.approx(1.0)
    assert result.max_wait_h == pytest.approx(1.0)
    # No free GPU while it waited: none of it is fragmentation's fault.
    assert result.fragmented_pending_gpu_hours == 0.0


def test_a_whole_gpu_pod_blocked_by_fragmentation_is_counted_as_such() -> None:
    result = churn_replay(nodes=TWO_NODES, pods=_fragmented(), settings=ChurnSettings(policy="fgpu"))
    waited_h = (7202.0 - 20.0) / 3600
    assert result.pending_gpu_hours == pytest.approx(waited_h, rel=1e-3)
    assert result.fragmented_pending_gpu_hours == pytest.approx(waited_h, rel=1e-3)
    assert result.moves == 0


def test_the_defragmenter_moves_one_pod_and_the_blocked_pod_starts_at_once() -> None:
    settings = ChurnSettings(policy="fgpu", defrag_per_100=50, defrag_wait_s=0, defrag_period_s=0)
    result = churn_replay(nodes=TWO_NODES, pods=_fragmented(), settings=settings)
    assert result.moves == 1
    assert result.plans == 1
    assert result.pending_gpu_hours == 0.0
    assert result.aborted == {}


def test_no_move_is_made_without_move_budget() -> None:
    settings = ChurnSettings(policy="fgpu", defrag_per_100=10, defrag_wait_s=0, defrag_period_s=0)
    result = churn_replay(nodes=TWO_NODES, pods=_fragmented(), settings=settings)
    assert result.moves == 0  # 10 per 100 arrivals of 5 arrivals: no whole move earned
    assert result.pending_gpu_hours > 1.9


def test_a_pod_that_fits_not_even_the_empty_cluster_is_not_queued() -> None:
    pods = [TimedPod(_pod("too-big", 1000, gpus=2), 0.0, 10.0)]
    result = churn_replay(nodes=TWO_NODES, pods=pods, settings=ChurnSettings(policy="fgpu"))
    assert result.never_fit == 1
    assert result.pending_gpu_hours == 0.0


def test_load_factor_compresses_arrivals_but_keeps_lifetimes() -> None:
    pods = [_pod("p", 500)]
    timed = timed_pods(pods, {"p": (1000, 1600)}, load_factor=10)
    assert timed == [TimedPod(pods[0], 100.0, 600.0)]
    with pytest.raises(ValueError, match="load_factor"):
        timed_pods(pods, {"p": (0, 1)}, load_factor=0)


def test_scale_cluster_keeps_the_model_mix() -> None:
    nodes = [TraceNode(f"n{i:02}", 1, 1, 8 if i % 2 else 2, "G2" if i < 10 else "T4") for i in range(20)]
    half = scale_cluster(nodes, 0.5)
    assert len(half) == 10
    assert sum(n.model == "T4" for n in half) == 5


def test_missing_time_columns_name_the_file_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,100\n")
    with pytest.raises(TraceError, match="creation_time"):
        read_lifetimes(path)


def test_fgpuctl_simulate_churn_prints_the_churn_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,65536,1,G2\nn2,64000,65536,1,G2\n")
    pods = tmp_path / "pods.csv"
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"]
    for t in _fragmented():
        created = int(t.arrive)
        rows.append(f"{t.pod.name},1000,1024,1,{t.pod.gpu_milli},,LS,Running,{created},{created + int(t.lifetime)},{created}")
    pods.write_text("\n".join(rows) + "\n")
    code = main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgpu", "--churn",
                 "--defrag", "50", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("policy", "seeds", "curve", "pending_gpu_hours", "moves", "arrivals", "mean_allocation"):
        assert key in report
    assert report["arrivals"] == 5
    assert report["policy"] == "fgpu"
    assert report["plan_outcomes"] == report["by_seed"][0]["plan_outcomes"]  # one seed: the sum is its own
    assert report["move_cost_gpu_hours"] == report["by_seed"][0]["move_cost_gpu_hours"]


def test_defrag_without_churn_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,65536,1,G2\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,100\n")
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgpu", "--defrag", "1"]) == 2
    assert "--churn" in capsys.readouterr().err


def test_every_plan_request_is_counted_by_its_outcome() -> None:
    settings = ChurnSettings(policy="fgpu", defrag_per_100=50, defrag_wait_s=0, defrag_period_s=0)
    result = churn_replay(nodes=TWO_NODES, pods=_fragmented(), settings=settings)
    assert result.plan_outcomes == {"attempts": {"planned": 1}, "blocker_sets": {}}
    # No pod may move per plan: refused, and each node's blocker set counted as over the budget.
    none = churn_replay(nodes=TWO_NODES, pods=_fragmented(), settings=replace(settings, max_moves_per_plan=0))
    assert none.moves == 0
    assert none.plan_outcomes == {
        "attempts": {"over-move-or-disruption-budget": 1},
        "blocker_sets": {"over-budget": 2},
    }


@pytest.mark.parametrize(
    ("lose_progress", "moved_leaves_s", "cost_s"),
    [(False, 20 + 600 + (7202 - 20), 600), (True, 20 + 600 + 7200, 600 + 18)],
)
def test_a_moved_pod_restarts_and_leaves_later_and_the_cost_is_counted(
    lose_progress: bool, moved_leaves_s: float, cost_s: float
) -> None:
    # A 0.3 pod (placed at 2 s, to leave at 7202 s) moves at 20 s; it restarts for 600 s and then
    # runs the rest of its lifetime, or all of it again when its progress is lost. A whole-GPU pod
    # fills the other GPU from 200 s; a 0.8 pod arriving at 7100 s waits for both 0.3 pods to leave.
    pods = [
        *_fragmented(),
        TimedPod(_pod("e-fill", 1000), 200.0, 20000.0),
        TimedPod(_pod("f-late", 800), 7100.0, 60.0),
    ]
    settings = ChurnSettings(
        policy="fgpu", defrag_per_100=50, defrag_wait_s=0, defrag_period_s=0, move_restart_s=600,
        moved_pods_lose_progress=lose_progress,
    )
    result = churn_replay(nodes=TWO_NODES, pods=pods, settings=settings)
    assert result.moves == 1
    assert result.pending_gpu_hours == pytest.approx(0.8 * (moved_leaves_s - 7100) / 3600, abs=2e-3)
    assert result.move_cost_gpu_hours == pytest.approx(0.3 * cost_s / 3600, abs=1e-3)


def test_a_negative_restart_time_is_refused() -> None:
    with pytest.raises(ValueError, match="move_restart_s"):
        churn_replay(nodes=TWO_NODES, pods=_fragmented(), settings=ChurnSettings(move_restart_s=-1))
