"""Churn replay benchmark: pending GPU-hours with and without defragmentation (docs/defrag.md).

    .venv/bin/python bench/churn.py [--traces DIR] [--out bench/results/churn]
                                    [--load-factor 100] [--cluster-fraction 0.1] [--seed 42]

For each workload (default, gpushare40, gpuspec20: the given workloads that carry pod times), runs
the churn replay (`scheduler_plugin/sim/churn.py`) with: fgpu alone, fgpu + defragmentation at
three move budgets (moves per 100 arrivals), FGD alone; `--jobs` workloads at once (2 by default).
Writes `<out>.json`, `<out>.md` and the plot `docs/images/churn-pending.svg`. The GPU-hours a move
recovers are given gross (pending GPU-hours saved per move) and net of what the moves cost the
moved pods (their restarts, `move_cost_gpu_hours`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler_plugin.sim.churn import ChurnSettings, churn_replay, read_lifetimes, scale_cluster, timed_pods
from scheduler_plugin.sim.trace import read_nodes, read_pods

WORKLOADS = ("default", "gpushare40", "gpuspec20")
BUDGETS = (0.1, 0.25, 1.0)
RUNS: tuple[tuple[str, str, float | None], ...] = (
    ("fgpu", "fgpu", None),
    *((f"fgpu+defrag {b:g}", "fgpu", b) for b in BUDGETS),
    ("fgd", "fgd", None),
)


def _run(traces: Path, workload: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    pod_file = traces / f"openb_pod_list_{workload}.csv"
    nodes = scale_cluster(read_nodes(traces / "openb_node_list_gpu_node.csv"), args.cluster_fraction)
    pods = timed_pods(read_pods(pod_file), read_lifetimes(pod_file), load_factor=args.load_factor)
    rows = []
    for label, policy, budget in RUNS:
        settings = ChurnSettings(policy=policy, seed=args.seed, load_factor=args.load_factor, defrag_per_100=budget)
        result = churn_replay(nodes=nodes, pods=pods, settings=settings)
        row = {k: v for k, v in asdict(result).items() if k != "samples"}
        row.update(workload=workload, run=label, moves_per_100_arrivals=round(result.moves_per_100_arrivals, 4))
        row["samples"] = [[s.hours, s.alloc_pct, s.waiting_gpu_pods] for s in result.samples]
        print(f"{workload:>11} {label:>18}: pending {result.pending_gpu_hours:9.1f} GPU-h, moves {result.moves:3}, "
              f"alloc {result.mean_allocation:6.2f}% ({result.seconds:.1f}s)", flush=True)
        rows.append(row)
    base = rows[0]["pending_gpu_hours"]
    for row in rows:
        saved = base - row["pending_gpu_hours"]
        row["reduction_pct"] = round(100 * saved / base, 1) if base else 0.0
        row["gpu_hours_recovered_per_move"] = round(saved / row["moves"], 2) if row["moves"] else None
        net = saved - row["move_cost_gpu_hours"]
        row["net_gpu_hours_recovered_per_move"] = round(net / row["moves"], 2) if row["moves"] else None
    return rows


def _markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# Churn replay: pending GPU-hours with and without defragmentation",
        "",
        f"`bench/churn.py --load-factor {args.load_factor:g} --cluster-fraction {args.cluster_fraction:g} "
        f"--seed {args.seed}`: the trace's own lifetimes, arrivals compressed {args.load_factor:g}x, on "
        f"{args.cluster_fraction:g} of the GPU nodes (same model and size mix). See docs/defrag.md.",
        "",
        "| workload | run | pending GPU-h | of it fragmentation | vs fgpu | moves | moves/100 arrivals "
        "| GPU-h recovered/move | move cost GPU-h | net GPU-h/move | GPU pods waited | p95 wait (min) "
        "| mean alloc % | run s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_move, net = (
            "-" if r[key] is None else f"{r[key]:.1f}"
            for key in ("gpu_hours_recovered_per_move", "net_gpu_hours_recovered_per_move")
        )
        lines.append(
            f"| {r['workload']} | {r['run']} | {r['pending_gpu_hours']:.1f} | {r['fragmented_pending_gpu_hours']:.1f} "
            f"| {0.0 - r['reduction_pct']:+.1f}% | {r['moves']} | {r['moves_per_100_arrivals']:.3f} | {per_move} "
            f"| {r['move_cost_gpu_hours']:.1f} | {net} | {r['gpu_pods_waited']} | {r['p95_wait_h'] * 60:.1f} "
            f"| {r['mean_allocation']:.2f} | {r['seconds']:.1f} |"
        )
    lines += [
        "",
        "Plan requests by outcome (`plan_outcomes`: per request, planned or the planner's refusal; per blocker "
        "set ranked and not taken, why):",
        "",
        "| workload | run | requests | planned | refused | blocker sets: moved pod fits nowhere | pending still "
        "blocked | over budget |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        attempts, sets = r["plan_outcomes"]["attempts"], r["plan_outcomes"]["blocker_sets"]
        if not attempts:
            continue
        refused = ", ".join(f"{k} {v}" for k, v in sorted(attempts.items()) if k != "planned") or "-"
        lines.append(
            f"| {r['workload']} | {r['run']} | {sum(attempts.values())} | {attempts.get('planned', 0)} | {refused} "
            f"| {sets.get('moved-pod-fits-nowhere', 0)} | {sets.get('pending-pod-still-blocked', 0)} "
            f"| {sets.get('over-budget', 0)} |"
        )
    return "\n".join(lines) + "\n"


def _svg(rows: list[dict[str, Any]]) -> str:
    """Grouped bars: pending GPU-hours per workload and run (no plotting library needed)."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    labels = [label for label, _, _ in RUNS]
    colours = ["#555", "#9ecae1", "#4292c6", "#08519c", "#e6550d"]
    peak = max(r["pending_gpu_hours"] for r in rows) or 1.0
    width, height, left, bottom, top = 760, 360, 60, 300, 30
    group = (width - left - 20) / len(workloads)
    bar = group * 0.8 / len(labels)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="18" font-size="13">Pending GPU-hours in the churn replay (lower is better)</text>',
             f'<line x1="{left}" y1="{bottom}" x2="{width - 10}" y2="{bottom}" stroke="black"/>']
    for tick in range(5):
        value = peak * tick / 4
        y = bottom - (bottom - top) * tick / 4
        parts.append(f'<text x="{left - 6}" y="{y + 4:.0f}" text-anchor="end">{value:.0f}</text>')
        parts.append(f'<line x1="{left}" y1="{y:.0f}" x2="{width - 10}" y2="{y:.0f}" stroke="#ddd"/>')
    for g, workload in enumerate(workloads):
        x0 = left + g * group + group * 0.1
        for k, label in enumerate(labels):
            row = next(r for r in rows if r["workload"] == workload and r["run"] == label)
            h = (bottom - top) * row["pending_gpu_hours"] / peak
            parts.append(f'<rect x="{x0 + k * bar:.1f}" y="{bottom - h:.1f}" width="{bar - 2:.1f}" height="{h:.1f}" fill="{colours[k]}"/>')
        parts.append(f'<text x="{x0 + group * 0.4:.0f}" y="{bottom + 16}" text-anchor="middle">{workload}</text>')
    for k, label in enumerate(labels):
        parts.append(f'<rect x="{left + k * 135}" y="{bottom + 30}" width="10" height="10" fill="{colours[k]}"/>')
        parts.append(f'<text x="{left + k * 135 + 14}" y="{bottom + 39}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default=os.environ.get("FGPU_TRACES", "/work/shared/traces/alibaba-gpu-v2023"))
    parser.add_argument("--out", default="bench/results/churn")
    parser.add_argument("--plot", default="docs/images/churn-pending.svg")
    parser.add_argument("--load-factor", type=float, default=100.0)
    parser.add_argument("--cluster-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--workload", action="append", help="workloads (default: default, gpushare40, gpuspec20)")
    parser.add_argument("--jobs", type=int, default=2, help="workloads replayed at once (processes)")
    args = parser.parse_args()
    workloads = args.workload or list(WORKLOADS)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        per_workload = list(pool.map(_run, [Path(args.traces)] * len(workloads), workloads, [args] * len(workloads)))
    rows = [row for result in per_workload for row in result]
    document = {
        "load_factor": args.load_factor,
        "cluster_fraction": args.cluster_fraction,
        "seed": args.seed,
        "runs": rows,
    }
    Path(args.out + ".json").write_text(json.dumps(document, indent=1) + "\n")
    Path(args.out + ".md").write_text(_markdown(rows, args))
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    Path(args.plot).write_text(_svg(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
