"""`fgpuctl simulate --overcommit RATIO --usage-mean FRACTION [--json]`: the burstable overcommit model.

Runs `scheduler_plugin.sim.overcommit` (the usage model is documented there and in
docs/overcommit.md) without and with overcommit at RATIO over the same seeded arrivals, and prints
`{"ratio", "usage_mean", "placed_without", "placed_with", "extra_pods_placed", "evictions",
"evictions_per_hour"}`.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_to(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("burstable overcommit model (docs/overcommit.md); needs no trace")
    group.add_argument("--overcommit", type=float, metavar="RATIO", default=None,
                       help="simulate burstable shares at this ratio (>= 1) against guaranteed-only placement")
    group.add_argument("--usage-mean", type=float, default=0.5, metavar="FRACTION",
                       help="mean steady usage as a fraction of the nominal size (default 0.5)")
    group.add_argument("--burst-per-min", type=float, default=0.002, help="chance per pod per minute of a burst")
    group.add_argument("--gpus", type=int, default=64, help="GPUs of 80 GiB in the simulated pool (default 64)")
    group.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    group.add_argument("--arrivals-per-hour", type=float, default=120.0, help="pod arrivals per hour (default 120)")


def run(args: argparse.Namespace) -> int:
    from scheduler_plugin.sim.overcommit import OvercommitScenario, UsageModel, simulate

    seeds = args.seed or [1]
    results = []
    try:
        for seed in seeds:
            scenario = OvercommitScenario(
                gpus=args.gpus, hours=args.hours, arrivals_per_hour=args.arrivals_per_hour, seed=seed,
                usage=UsageModel(usage_mean=args.usage_mean, burst_per_min=args.burst_per_min),
            )
            results.append(simulate(scenario, ratio=args.overcommit).to_json())
    except ValueError as exc:
        print(f"fgpuctl simulate: {exc}", file=sys.stderr)
        return 2
    merged = dict(results[0])
    if len(results) > 1:
        for key in ("placed_without", "placed_with", "extra_pods_placed", "evictions", "evictions_per_hour"):
            merged[key] = round(sum(float(r[key]) for r in results) / len(results), 3)
        merged["seeds"] = len(results)
    if args.json:
        print(json.dumps(merged, sort_keys=True))
    else:
        print(f"ratio {merged['ratio']}, usage mean {merged['usage_mean']:.0%}: {merged['extra_pods_placed']} extra pods "
              f"placed ({merged['placed_without']} -> {merged['placed_with']}), "
              f"{merged['evictions_per_hour']} evictions per hour")
    return 0
