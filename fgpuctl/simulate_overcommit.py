"""`fgpuctl simulate --overcommit RATIO --usage-mean FRACTION [--json]`: the burstable overcommit model.

    fgpuctl simulate --overcommit 1.5 --usage-mean 0.5 --churn --nodes NODES.csv --pods PODS.csv \
        [--load-factor 100] [--cluster-fraction 0.1] --json     # on the churn replay's pods (docs/defrag.md)
    fgpuctl simulate --overcommit 1.5 --usage-mean 0.5 --json   # on synthetic arrivals (no trace needed)

Runs `scheduler_plugin.sim.overcommit` (the usage model is documented there and in
docs/overcommit.md) without and with overcommit at RATIO over the same seeded pods, and prints
`{"ratio", "usage_mean", "placed_without", "placed_with", "extra_pods_placed", "evictions",
"evictions_per_hour"}` (with `"source": "churn"` or `"synthetic"`).
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
    group.add_argument("--gpus", type=int, default=64,
                       help="without --churn: GPUs of 80 GiB in the synthetic pool (default 64)")
    group.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    group.add_argument("--arrivals-per-hour", type=float, default=120.0, help="pod arrivals per hour (default 120)")


def run(args: argparse.Namespace) -> int:
    from scheduler_plugin.sim.churn import read_lifetimes, scale_cluster, timed_pods
    from scheduler_plugin.sim.overcommit import OvercommitScenario, UsageModel, simulate, trace_scenario
    from scheduler_plugin.sim.trace import TraceError, read_nodes, read_pods

    seeds = args.seed or [1]
    results = []
    usage = UsageModel(usage_mean=args.usage_mean, burst_per_min=args.burst_per_min)
    try:
        if args.churn:
            if not args.nodes or not args.pods:
                raise ValueError("--overcommit with --churn replays a trace: give --nodes and --pods")
            nodes = scale_cluster(read_nodes(args.nodes), args.cluster_fraction)
            pods = timed_pods(read_pods(args.pods), read_lifetimes(args.pods), load_factor=args.load_factor)
        for seed in seeds:
            if args.churn:
                scenario = trace_scenario(nodes, pods, usage=usage, seed=seed)
            else:
                scenario = OvercommitScenario(
                    gpus=args.gpus, hours=args.hours, arrivals_per_hour=args.arrivals_per_hour, seed=seed, usage=usage,
                )
            results.append(simulate(scenario, ratio=args.overcommit).to_json())
    except (TraceError, ValueError) as exc:
        print(f"fgpuctl simulate: {exc}", file=sys.stderr)
        return 2
    merged: dict[str, object] = {**results[0], "source": "churn" if args.churn else "synthetic"}
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
