"""The overcommit model through `fgpuctl simulate --overcommit`: a smoke run, seeded and honest about its trade."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scheduler_plugin.sim.churn import read_lifetimes, timed_pods
from scheduler_plugin.sim.overcommit import OvercommitScenario, UsageModel, simulate, trace_scenario
from scheduler_plugin.sim.trace import read_nodes, read_pods


def _small(usage: float, seed: int = 1) -> OvercommitScenario:
    return OvercommitScenario(gpus=8, hours=3, arrivals_per_hour=16, seed=seed, usage=UsageModel(usage_mean=usage))


def test_the_cli_prints_extra_pods_and_evictions_per_hour_as_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fgpuctl.main", "simulate", "--overcommit", "1.5", "--usage-mean", "0.5",
         "--gpus", "8", "--hours", "3", "--arrivals-per-hour", "16", "--json"],
        capture_output=True, text=True, check=True, timeout=120,
    )
    result = json.loads(out.stdout)
    assert result["extra_pods_placed"] == result["placed_with"] - result["placed_without"]
    assert result["evictions_per_hour"] >= 0 and result["ratio"] == 1.5


def test_the_same_seed_gives_the_same_result_and_busier_pods_get_evicted_more() -> None:
    assert simulate(_small(0.5), ratio=1.5) == simulate(_small(0.5), ratio=1.5)
    quiet = sum(simulate(_small(0.3, seed), ratio=2).evictions for seed in (1, 2))
    busy = sum(simulate(_small(0.9, seed), ratio=2).evictions for seed in (1, 2))
    assert busy > quiet


def test_a_ratio_under_one_is_refused_with_the_fix() -> None:
    try:
        simulate(_small(0.5), ratio=0.5)
    except ValueError as exc:
        assert "at least 1" in str(exc)
    else:
        raise AssertionError("ratio 0.5 was accepted")


# --- on the churn replay's pods (sim/churn.py) ----------------------------------------------------------------

NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,A10\nn1,64000,262144,1,A10\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def _trace(tmp_path: Path, rows: list[str]) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(POD_HEADER + "".join(f"{row}\n" for row in rows))
    return nodes, pods


def test_the_churn_replays_pods_keep_their_times_and_whole_cards_take_free_cards_of_one_node(tmp_path: Path) -> None:
    nodes, pods = _trace(tmp_path, [
        "two-cards,8000,1024,2,1000,,LS,Running,0,36000,0",      # fills n0 for 10 h
        "half-a,1000,1024,1,500,,LS,Running,60,3660,60",         # shares of n1's one card
        "half-b,1000,1024,1,500,,LS,Running,120,3720,120",
        "another-two,8000,1024,2,1000,,LS,Running,150,600,150",  # no node has two free cards: refused
        "cpu-only,1000,1024,0,0,,LS,Running,170,600,170",        # no GPU: left out
        "half-c,1000,1024,1,500,,LS,Running,180,3780,180",       # n1 is full of requests unless they are burstable
    ])
    scenario = trace_scenario(read_nodes(nodes), timed_pods(read_pods(pods), read_lifetimes(pods), load_factor=1),
                              usage=UsageModel(usage_mean=0.5), seed=1, burstable_fraction=1.0)
    assert scenario.node_gpus == (2, 1) and scenario.hours == 4 / 60
    assert [(a.arrive_min, a.leave_min, a.nominal_gib, a.cards) for a in scenario.arrivals] == [
        (0, 600, 160.0, 2), (1, 61, 40.0, 0), (2, 62, 40.0, 0), (2, 9, 160.0, 2), (3, 63, 40.0, 0)]
    result = simulate(scenario, ratio=1.5)
    assert result.placed_without == 3  # two-cards, half-a, half-b
    # Burstable halves reserve 20 GiB each with 40 GiB limits: 3 x 40 = 120 = 1.5 x 80 GiB, so half-c fits.
    assert result.placed_with == 4


def test_the_cli_runs_the_model_on_the_churn_replay(tmp_path: Path) -> None:
    nodes, pods = _trace(tmp_path, [f"p{i},1000,1024,1,{300 + 50 * (i % 5)},,LS,Running,{i * 60},{i * 60 + 3600},0"
                                    for i in range(40)])
    out = subprocess.run(
        [sys.executable, "-m", "fgpuctl.main", "simulate", "--overcommit", "1.5", "--usage-mean", "0.5", "--churn",
         "--nodes", str(nodes), "--pods", str(pods), "--json"],
        capture_output=True, text=True, check=True, timeout=120,
    )
    result = json.loads(out.stdout)
    assert result["source"] == "churn"
    assert result["extra_pods_placed"] == result["placed_with"] - result["placed_without"] > 0
