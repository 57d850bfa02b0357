"""Dynamic MIG in the openb replay: static pre-partitioning, dynamic first-fit, dynamic fgpu placement.

    nice -n 10 .venv/bin/python bench/mig.py --traces ../shared/traces/alibaba-gpu-v2023

A MIG-only pool of A100-80GB nodes takes each workload's single-GPU pods (arrive-only, seeded
order, sized so they ask `--load` times its compute slices); the model, the mapping of shares to
profiles and the strategies are in scheduler_plugin/sim/mig_pool.py. Writes
bench/results/mig.json and bench/results/mig.md (the table docs/mig.md shows). At most two
processes (`--jobs`); the traces stay outside the repository.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path
from typing import Any

from scheduler_plugin.sim import mig_pool
from scheduler_plugin.sim.trace import read_pods

WORKLOADS = ("default", "gpushare40", "gpushare60")
STRATEGIES = ("static:balanced", "static:halves", "static:whole", "first-fit", "fgpu")
RESULTS = Path(__file__).resolve().parent / "results"


def one(job: tuple[str, str, int, float, int]) -> list[dict[str, Any]]:
    traces, workload, seed, load, limit = job
    pods = mig_pool.pool_pods(read_pods(Path(traces) / f"openb_pod_list_{workload}.csv"), seed=seed)
    if limit:
        pods = pods[:limit]
    gpus = mig_pool.pool_size(pods, load=load)
    return [{"workload": workload, "seed": seed, "load": load, **mig_pool.run(s, pods, gpus).to_json()} for s in STRATEGIES]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | GPUs | pods | strategy | placed | allocation (slices) | internal waste (slices) | free / stranded (slices) | instances |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        instances = ", ".join(f"{k} {v}" for k, v in r["instances"].items())
        lines.append(
            f"| {r['workload']} | {r['gpus']} | {r['pods']} | {r['strategy']} | {r['placed']} ({r['placed_percent']}%) "
            f"| {r['allocation_percent']}% | {r['internal_waste_slices']} | {r['free_slices']} / {r['stranded_slices']} "
            f"| {instances} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", required=True, help="directory of the openb CSVs")
    parser.add_argument("--workload", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--load", type=float, default=1.3, help="pods' compute slices / the pool's (default 1.3)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N pods of each run (0: all)")
    parser.add_argument("--jobs", type=int, default=2, choices=[1, 2])
    parser.add_argument("--out", default=str(RESULTS), help="where mig.json and mig.md go")
    args = parser.parse_args(argv)
    jobs = [(args.traces, w, args.seed, args.load, args.limit) for w in args.workload]
    if args.jobs > 1 and len(jobs) > 1:
        with multiprocessing.Pool(args.jobs) as pool:
            per_job = pool.map(one, jobs)
    else:
        per_job = [one(j) for j in jobs]
    rows = [r for rs in per_job for r in rs]
    out = Path(args.out)
    (out / "mig.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "mig.md").write_text(table(rows))
    sys.stdout.write(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
