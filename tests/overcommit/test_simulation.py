"""The overcommit model through `fgpuctl simulate --overcommit`: a smoke run, seeded and honest about its trade."""

from __future__ import annotations

import json
import subprocess
import sys

from scheduler_plugin.sim.overcommit import OvercommitScenario, UsageModel, simulate


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
