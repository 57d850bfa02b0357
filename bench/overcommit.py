"""Burstable overcommit: extra pods placed versus evictions per hour over mean usage 30-90% (docs/overcommit.md).

    nice -n 10 .venv/bin/python bench/overcommit.py [--traces DIR] [--workload default] [--load-factor 100]
        [--cluster-fraction 0.1] [--out bench/results/overcommit]
    nice -n 10 .venv/bin/python bench/overcommit.py --synthetic [--gpus 64] [--hours 24]

Runs `scheduler_plugin/sim/overcommit.py` (the seeded usage model documented there) for ratios 1.0,
1.5 and 2.0 at mean usage 30, 50, 70 and 90% of the nominal size, three seeds each (the seed draws
usage, bursts and which share pods are burstable), and writes `<out>.json`, `<out>.md` and the plot
`docs/images/overcommit-tradeoff.svg`. The pods are the churn replay's (`sim/churn.py`, the settings of
bench/churn.py: the openb trace's own lifetimes, arrivals compressed 100x, 0.1 of the GPU nodes);
`--synthetic` uses the model's own Poisson arrivals instead, which need no trace.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler_plugin.sim.churn import read_lifetimes, scale_cluster, timed_pods
from scheduler_plugin.sim.overcommit import OvercommitScenario, UsageModel, simulate, trace_scenario
from scheduler_plugin.sim.trace import read_nodes, read_pods

RATIOS = (1.0, 1.5, 2.0)
USAGE = (0.3, 0.5, 0.7, 0.9)
SEEDS = (1, 2, 3)
COLOURS = {1.0: "#1f77b4", 1.5: "#ff7f0e", 2.0: "#2ca02c"}


def scenarios(args: argparse.Namespace) -> tuple[str, dict[tuple[float, int], OvercommitScenario]]:
    """What the run covers, in words, and a scenario per (mean usage, seed)."""
    if args.synthetic:
        made = {(u, seed): OvercommitScenario(gpus=args.gpus, hours=args.hours, arrivals_per_hour=args.gpus * 2.0,
                                              seed=seed, usage=UsageModel(usage_mean=u))
                for u in USAGE for seed in SEEDS}
        return (f"Synthetic arrivals: pool of {args.gpus} GPUs (80 GiB), {args.hours:g} h, {args.gpus * 2} "
                f"arrivals/h, mean of seeds {list(SEEDS)}."), made
    traces = Path(args.traces)
    pod_file = traces / f"openb_pod_list_{args.workload}.csv"
    nodes = scale_cluster(read_nodes(traces / "openb_node_list_gpu_node.csv"), args.cluster_fraction)
    pods = timed_pods(read_pods(pod_file), read_lifetimes(pod_file), load_factor=args.load_factor)
    made = {(u, seed): trace_scenario(nodes, pods, usage=UsageModel(usage_mean=u), seed=seed)
            for u in USAGE for seed in SEEDS}
    any_one = next(iter(made.values()))
    return (f"Churn replay of openb `{args.workload}` (`--load-factor {args.load_factor:g} --cluster-fraction "
            f"{args.cluster_fraction:g}`): {len(nodes)} nodes, {any_one.gpus} GPUs taken as 80 GiB each, "
            f"{len(any_one.arrivals)} GPU pods over {any_one.hours:.1f} h; mean of seeds {list(SEEDS)}."), made


def measure(made: dict[tuple[float, int], OvercommitScenario]) -> list[dict[str, float]]:
    rows = []
    for ratio in RATIOS:
        for usage in USAGE:
            runs = [simulate(made[(usage, seed)], ratio=ratio) for seed in SEEDS]
            rows.append({
                "ratio": ratio, "usage_mean": usage,
                "placed_without": sum(r.placed_without for r in runs) / len(runs),
                "placed_with": sum(r.placed_with for r in runs) / len(runs),
                "extra_pods_placed": sum(r.extra_pods_placed for r in runs) / len(runs),
                "extra_percent": 100 * sum(r.extra_pods_placed / r.placed_without for r in runs) / len(runs),
                "evictions_per_hour": sum(r.evictions_per_hour for r in runs) / len(runs),
            })
    return rows


def table(rows: list[dict[str, float]], what: str) -> str:
    out = [what, "",
           "| ratio | mean usage | placed without | placed with | extra pods | extra % | evictions/h |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['ratio']:g} | {r['usage_mean']:.0%} | {r['placed_without']:.0f} | {r['placed_with']:.0f} | "
                   f"{r['extra_pods_placed']:.0f} | {r['extra_percent']:.1f} | {r['evictions_per_hour']:.2f} |")
    return "\n".join(out) + "\n"


def svg(rows: list[dict[str, float]]) -> str:
    width, height, left, bottom, top, right = 560, 340, 60, 50, 20, 120
    xmax = max(r["evictions_per_hour"] for r in rows) * 1.1 or 1.0
    ymax = max(r["extra_percent"] for r in rows) * 1.1 or 1.0

    def x(v: float) -> float:
        return left + v / xmax * (width - left - right)

    def y(v: float) -> float:
        return height - bottom - max(v, 0) / ymax * (height - bottom - top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
             f'<text x="{(left + width - right) / 2}" y="{height - 15}" text-anchor="middle">evictions per hour</text>',
             f'<text x="15" y="{(top + height - bottom) / 2}" transform="rotate(-90 15 {(top + height - bottom) / 2})" '
             'text-anchor="middle">extra pods placed (%)</text>']
    for i in range(5):
        xv, yv = xmax * i / 4, ymax * i / 4
        parts.append(f'<text x="{x(xv):.1f}" y="{height - bottom + 14}" text-anchor="middle">{xv:.1f}</text>')
        parts.append(f'<text x="{left - 5}" y="{y(yv) + 4:.1f}" text-anchor="end">{yv:.0f}</text>')
    for n, ratio in enumerate(RATIOS):
        mine = [r for r in rows if r["ratio"] == ratio]
        points = " ".join(f"{x(r['evictions_per_hour']):.1f},{y(r['extra_percent']):.1f}" for r in mine)
        parts.append(f'<polyline points="{points}" fill="none" stroke="{COLOURS[ratio]}" stroke-width="2"/>')
        for r in mine:
            parts.append(f'<circle cx="{x(r["evictions_per_hour"]):.1f}" cy="{y(r["extra_percent"]):.1f}" r="3" '
                         f'fill="{COLOURS[ratio]}"/>')
            parts.append(f'<text x="{x(r["evictions_per_hour"]) + 5:.1f}" y="{y(r["extra_percent"]) - 5:.1f}" '
                         f'fill="{COLOURS[ratio]}">{r["usage_mean"]:.0%}</text>')
        parts.append(f'<text x="{width - right + 10}" y="{top + 20 + 18 * n}" fill="{COLOURS[ratio]}">ratio {ratio:g}</text>')
    parts.append(f'<text x="{width - right + 10}" y="{top + 90}">labels: mean</text>')
    parts.append(f'<text x="{width - right + 10}" y="{top + 104}">usage of request</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/overcommit")
    parser.add_argument("--traces", default=os.environ.get("FGPU_TRACES", "/work/shared/traces/alibaba-gpu-v2023"))
    parser.add_argument("--workload", default="default")
    parser.add_argument("--load-factor", type=float, default=100.0)
    parser.add_argument("--cluster-fraction", type=float, default=0.1)
    parser.add_argument("--synthetic", action="store_true", help="the model's own arrivals instead of the churn replay")
    parser.add_argument("--gpus", type=int, default=64, help="with --synthetic")
    parser.add_argument("--hours", type=float, default=24.0, help="with --synthetic")
    parser.add_argument("--plot", default="docs/images/overcommit-tradeoff.svg")
    args = parser.parse_args()
    what, made = scenarios(args)
    rows = measure(made)
    source = "synthetic" if args.synthetic else "churn"
    Path(f"{args.out}.json").write_text(json.dumps({"source": source, "what": what, "seeds": list(SEEDS),
                                                    "rows": rows}, indent=1) + "\n")
    Path(f"{args.out}.md").write_text(table(rows, what))
    Path(args.plot).write_text(svg(rows))
    print(table(rows, what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
