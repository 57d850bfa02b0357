"""Chaos soak: fgpu's daemons under pod churn and faults, with invariants checked from outside.

    sudo .venv/bin/python bench/soak.py --minutes 5 --seed 7 --json
    sudo .venv/bin/python bench/soak.py --minutes 30 --seed 1 --traces ../shared/traces/alibaba-gpu-v2023 --json

Prints one JSON object (pods_created, faults per kind, violations with seed and
step, latencies, recovery, leaks, RSS/fd slopes); `--out FILE` also writes it.
Exit status 1 when any invariant was violated. Needs root, containerd, runc and
busybox (as hack/local-up.sh). docs/soak.md says what is covered.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.soak.runner import Options, Soak  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(prog="bench/soak.py", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=5.0, help="churn phase length (recovery and drain follow)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rate", type=float, default=0.6, help="pods created per second")
    p.add_argument("--lifetime", type=float, default=25.0, help="mean pod lifetime, seconds")
    p.add_argument("--fault-every", type=float, default=6.0, help="mean seconds between faults")
    p.add_argument("--lease", type=float, default=3.0, help="scheduler Lease duration, seconds")
    p.add_argument("--traces", default=None, help="alibaba-gpu-v2023 directory (openb shapes); default: built-in")
    p.add_argument("--isolation", default="hami-core", choices=("hami-core", "mps", "none"))
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    p.add_argument("--json", action="store_true", help="print the JSON report (else a summary)")
    p.add_argument("--out", default="", help="also write the JSON report here")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="fgpu-soak-", dir="/tmp")  # short: unix socket paths
    options = Options(
        seconds=args.minutes * 60, seed=args.seed, nodes=args.nodes, rate_per_s=args.rate,
        lifetime_s=args.lifetime, fault_every_s=args.fault_every, lease_s=args.lease,
        trace_dir=args.traces, root=root, repo=ROOT, keep=args.keep, isolation=args.isolation,
    )
    result = Soak(options, log=lambda line: print(f"[soak] {line}", file=sys.stderr, flush=True)).run()
    result["command"] = " ".join(["python", "bench/soak.py", *sys.argv[1:]])
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        print(text)
    else:
        print(f"pods {result['pods_created']}, faults {result['faults_total']}, "
              f"violations {len(result['violations'])}")
    for v in result["violations"]:
        print(f"violation (replay: --seed {v['seed']}, step {v['step']}): {v['invariant']}: {v['detail']}",
              file=sys.stderr)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
