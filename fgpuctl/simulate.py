"""`fgpuctl simulate`: replay a production GPU trace through the scheduler core.

    fgpuctl simulate --nodes NODES.csv --pods PODS.csv --policy NAME [--seed S ...] [--tune 1.3]
                     [--json] [--plot out.png]

Follows the replay protocol of the Alibaba trace (cluster-trace-gpu-v2023): see docs/simulator.md.
`--json` prints, per policy,
`{"policy", "seeds", "alloc_at_100", "alloc_at_100_by_seed", "frag_at_100", "curve"}`
(one object for one policy, a list for several); a figure never measured (arrival that never
came near 100%) is null, so the output is strict JSON.

    fgpuctl simulate --churn [--defrag MOVES_PER_100_ARRIVALS] [--load-factor F] [--cluster-fraction C] ...

replays with time (scheduler_plugin/sim/churn.py, docs/defrag.md): the same keys (the arrive-only
headlines null, `curve` = allocation % over hours) plus `pending_gpu_hours`,
`fragmented_pending_gpu_hours`, `moves`, `arrivals`, `mean_allocation`, waiting times, `move_cost_gpu_hours`,
`plan_outcomes` (summed over seeds) and `samples`.
Seeds default to 42 only (a churn run is deterministic but for node-order ties).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from fgpuctl import simulate_overcommit as overcommit_args

DEFAULT_SEEDS = list(range(42, 52))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Required unless --overcommit (checked in run): that model needs no trace.
    parser.add_argument("--nodes", help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    parser.add_argument("--pods", help="pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...])")
    parser.add_argument(
        "--policy",
        action="append",
        help="scoring policy, repeat or comma-separate to compare several (a wrong name lists the registered ones)",
    )
    parser.add_argument("--seed", type=int, nargs="+", default=None, help="run seeds (default 42..51); the mean is reported")
    parser.add_argument(
        "--tune", type=float, default=1.3, help="tune the total GPU request to this multiple of capacity (0 = as is)"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="numeric policy parameter, given to each chosen policy that takes KEY",
    )
    parser.add_argument(
        "--learn-workload",
        action="store_true",
        help="don't give fgd/fgpu the trace's typical pod shapes; they learn them from the pods as they arrive, "
        "as the live scheduler does",
    )
    churn = parser.add_argument_group("churn replay (pods arrive at creation_time and leave at deletion_time)")
    churn.add_argument("--churn", action="store_true", help="replay with time and departures (see docs/defrag.md)")
    churn.add_argument(
        "--defrag",
        type=float,
        default=None,
        metavar="MOVES_PER_100_ARRIVALS",
        help="defragment with at most this many pod moves per 100 arrivals (default: no defragmentation)",
    )
    churn.add_argument(
        "--load-factor", type=float, default=1.0, help="compress inter-arrival times by this factor (default 1: the trace's pace)"
    )
    churn.add_argument(
        "--cluster-fraction",
        type=float,
        default=1.0,
        help="replay on this share of the GPU nodes, same model and size mix (default 1: all)",
    )
    overcommit_args.add_to(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--plot", metavar="PNG", help="draw allocation against arrived workload (needs matplotlib)")


def _params(raw: list[str]) -> dict[str, float]:
    params: dict[str, float] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        try:
            if not sep or not key:
                raise ValueError
            params[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--param {item!r}: write KEY=NUMBER, e.g. --param weight_cpu=0.5") from None
    return params


def run(args: argparse.Namespace) -> int:
    if args.overcommit is not None:
        return overcommit_args.run(args)
    missing = [f"--{name}" for name in ("nodes", "pods", "policy") if not getattr(args, name)]
    if missing:
        print(f"fgpuctl simulate: {', '.join(missing)} required (or --overcommit RATIO for the overcommit model)",
              file=sys.stderr)
        return 2
    from scheduler_plugin.core.policies import UnknownPolicyError, policy_names, policy_spec
    from scheduler_plugin.sim.records import curve
    from scheduler_plugin.sim.replay import RunResult, replay
    from scheduler_plugin.sim.trace import TraceError, read_nodes, read_pods

    policies = [p.strip() for raw in args.policy for p in raw.split(",") if p.strip()]
    known = policy_names()
    unknown = [p for p in policies if p not in known]
    if unknown:
        print(f"fgpuctl simulate: unknown policy {', '.join(unknown)}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    if args.tune < 0:
        print(f"fgpuctl simulate: --tune {args.tune} is negative; give a ratio such as 1.3, or 0 to replay as is", file=sys.stderr)
        return 2
    seeds: list[int] = args.seed or DEFAULT_SEEDS
    if args.churn:
        return _churn(args, policies, args.seed or DEFAULT_SEEDS[:1])
    if args.defrag is not None:
        print("fgpuctl simulate: --defrag needs --churn (pods must leave for moves to matter)", file=sys.stderr)
        return 2
    try:
        params = _params(args.param)
        nodes = read_nodes(args.nodes)
        pods = read_pods(args.pods)
    except (TraceError, ValueError) as error:
        print(f"fgpuctl simulate: {error}", file=sys.stderr)
        return 2
    takes = {policy: policy_spec(policy).param_names for policy in policies}
    stray = sorted(key for key in params if not any(key in names for names in takes.values()))
    if stray:
        offered = "; ".join(f"{policy} takes {', '.join(names) or 'none'}" for policy, names in takes.items())
        print(f"fgpuctl simulate: --param {', '.join(stray)}: no chosen policy takes it; {offered}", file=sys.stderr)
        return 2

    reports: list[dict[str, Any]] = []
    curves: dict[str, list[tuple[float, float]]] = {}
    for policy in policies:
        results: list[RunResult] = []
        for seed in seeds:
            try:
                result = replay(
                    nodes=nodes,
                    pods=pods,
                    policy=policy,
                    seed=seed,
                    tune=args.tune or None,
                    params={key: value for key, value in params.items() if key in takes[policy]},
                    learn_workload=args.learn_workload,
                )
            except (UnknownPolicyError, ValueError, TypeError) as error:
                print(f"fgpuctl simulate: policy {policy}: {error}", file=sys.stderr)
                return 2
            results.append(result)
            if not args.json:
                print(
                    f"{policy:>8} seed {seed}: alloc@100 {_pct(result.alloc_at_100, 6)}  "
                    f"frag@100 {_pct(result.frag_at_100, 5)}  "
                    f"placed {result.placed} failed {result.failed} of {result.pods} ({result.seconds:.1f}s)",
                    flush=True,
                )
                if math.isnan(result.alloc_at_100):
                    print(
                        f"{policy:>8} seed {seed}: no alloc@100: arrival peaked at "
                        f"{max(result.records.arrived_pct):.2f}% of GPU capacity, never near 100%; "
                        "raise --tune or replay a bigger trace",
                        flush=True,
                    )
        by_seed = [round(r.alloc_at_100, 3) for r in results]
        points = curve([r.records for r in results])
        curves[policy] = points
        report = {
            "policy": policy,
            "seeds": seeds,
            "alloc_at_100": round(sum(r.alloc_at_100 for r in results) / len(results), 3),
            "alloc_at_100_by_seed": by_seed,
            "frag_at_100": round(sum(r.frag_at_100 for r in results) / len(results), 3),
            "curve": [[a, b] for a, b in points],
        }
        reports.append(report)
        if not args.json:
            print(
                f"{policy:>8} mean over {len(seeds)} seed(s): alloc@100 {_pct(report['alloc_at_100'])}  "
                f"frag@100 {_pct(report['frag_at_100'])}"
            )
    if args.json:
        _print_json(reports[0] if len(reports) == 1 else reports)
    if args.plot:
        from scheduler_plugin.sim.plotting import PlotUnavailableError, plot_curves

        try:
            plot_curves(curves, path=args.plot)
        except PlotUnavailableError as error:
            print(f"fgpuctl simulate: {error}", file=sys.stderr)
            return 2
    return 0


def _churn(args: argparse.Namespace, policies: list[str], seeds: list[int]) -> int:
    from dataclasses import asdict

    from scheduler_plugin.sim.churn import (
        ChurnResult,
        ChurnSettings,
        churn_replay,
        read_lifetimes,
        scale_cluster,
        timed_pods,
    )
    from scheduler_plugin.sim.trace import TraceError, read_nodes, read_pods

    if args.defrag is not None and args.defrag < 0:
        print(f"fgpuctl simulate: --defrag {args.defrag}: give 0 or more moves per 100 arrivals", file=sys.stderr)
        return 2
    try:
        nodes = scale_cluster(read_nodes(args.nodes), args.cluster_fraction)
        pods = timed_pods(read_pods(args.pods), read_lifetimes(args.pods), load_factor=args.load_factor)
    except (TraceError, ValueError) as error:
        print(f"fgpuctl simulate: {error}", file=sys.stderr)
        return 2
    reports: list[dict[str, Any]] = []
    for policy in policies:
        results: list[ChurnResult] = []
        for seed in seeds:
            settings = ChurnSettings(policy=policy, seed=seed, load_factor=args.load_factor, defrag_per_100=args.defrag)
            result = churn_replay(nodes=nodes, pods=pods, settings=settings)
            results.append(result)
            if not args.json:
                print(
                    f"{policy:>8} seed {seed}: pending {result.pending_gpu_hours:.1f} GPU-h "
                    f"({result.fragmented_pending_gpu_hours:.1f} of it fragmentation), mean alloc "
                    f"{result.mean_allocation:.2f}%, {result.gpu_pods_waited} GPU pods waited (p95 "
                    f"{result.p95_wait_h * 60:.1f} min), {result.moves} moves ({result.seconds:.1f}s)",
                    flush=True,
                )
        first = results[0]
        count = len(results)
        report: dict[str, Any] = {
            "policy": policy,
            "seeds": seeds,
            "alloc_at_100": None,
            "alloc_at_100_by_seed": [],
            "frag_at_100": None,
            "curve": [[s.hours, s.alloc_pct] for s in first.samples],
            "churn": True,
            "load_factor": args.load_factor,
            "cluster_fraction": args.cluster_fraction,
            "defrag": args.defrag,
            "arrivals": first.arrivals,
            "gpu_arrivals": first.gpu_arrivals,
            "never_fit": first.never_fit,
            "pending_gpu_hours": round(sum(r.pending_gpu_hours for r in results) / count, 3),
            "fragmented_pending_gpu_hours": round(sum(r.fragmented_pending_gpu_hours for r in results) / count, 3),
            "mean_allocation": round(sum(r.mean_allocation for r in results) / count, 3),
            "mean_frag": round(sum(r.mean_frag for r in results) / count, 3),
            "moves": round(sum(r.moves for r in results) / count, 2),
            "moves_per_100_arrivals": round(sum(r.moves_per_100_arrivals for r in results) / count, 4),
            "gpu_pods_waited": round(sum(r.gpu_pods_waited for r in results) / count, 1),
            "mean_wait_h": round(sum(r.mean_wait_h for r in results) / count, 4),
            "p95_wait_h": round(sum(r.p95_wait_h for r in results) / count, 4),
            "max_wait_h": max(r.max_wait_h for r in results),
            "aborted": [dict(r.aborted) for r in results],
            "move_cost_gpu_hours": round(sum(r.move_cost_gpu_hours for r in results) / count, 3),
            "plan_outcomes": _summed(r.plan_outcomes for r in results),
            "by_seed": [
                {k: v for k, v in asdict(r).items() if k not in ("samples", "aborted")} for r in results
            ],
            "samples": [asdict(s) for s in first.samples],
        }
        reports.append(report)
    if args.json:
        _print_json(reports[0] if len(reports) == 1 else reports)
    return 0


def _pct(value: float, width: int = 0) -> str:
    """`value` as a percentage, or n/a where it was never measured (NaN)."""
    return f"{'n/a':>{width}} " if math.isnan(value) else f"{value:{width}.2f}%"


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinite float (a figure never measured) made None, i.e. JSON null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _print_json(value: Any) -> None:
    # NaN is not JSON: strict parsers (jq, browsers, Go) refuse it.
    print(json.dumps(_finite(value), allow_nan=False))


def _summed(outcomes: Iterable[Mapping[str, Mapping[str, int]]]) -> dict[str, dict[str, int]]:
    """The churn replay's plan outcomes, counted over every seed."""
    total: dict[str, dict[str, int]] = {}
    for outcome in outcomes:
        for group, counts in outcome.items():
            into = total.setdefault(group, {})
            for key, n in counts.items():
                into[key] = into.get(key, 0) + n
    return total
