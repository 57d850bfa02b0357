"""`fgpuctl trace-variant`: a new workload made from a trace along the published variants' axes.

    fgpuctl trace-variant --nodes NODES.csv --pods PODS.csv --out VARIANT.csv [--seed 0]
        [--constrained PCT] [--constraints-from PODS.csv] [--sharing PCT] [--multi-gpu PCT]
        [--cpu-only PCT]

Each axis is a percentage: of GPU pods with a model constraint (0-60), of GPU pods that share a
GPU (0-100), of GPU pods asking for several GPUs (0-60), and the CPU-only pod population against
the base trace's (0-300). An axis not given keeps the base's value. The total GPU request stays the
base's (docs/simulator.md, "Workload variants"). The variant is written to `--out`, never into
this repository (the trace's terms keep its data out of it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: the checkout this module runs from, when it is one: variants must not be written into it
_REPO = Path(__file__).resolve().parent.parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", required=True, help="node list CSV (which models can host a constrained pod)")
    parser.add_argument("--pods", required=True, help="base pod list CSV (the default trace)")
    parser.add_argument("--out", required=True, help="where to write the variant's pod list (outside this repository)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    parser.add_argument("--constrained", type=float, metavar="PCT", help="%% of GPU pods with a GPU-model constraint (0-60)")
    parser.add_argument(
        "--constraints-from",
        metavar="PODS.csv",
        help="pod list whose model lists are drawn (default: the base; the default trace has none, gpuspec20 has)",
    )
    parser.add_argument("--sharing", type=float, metavar="PCT", help="%% of GPU pods that share a GPU (0-100)")
    parser.add_argument("--multi-gpu", type=float, metavar="PCT", help="%% of GPU pods asking for several GPUs (0-60)")
    parser.add_argument("--cpu-only", type=float, metavar="PCT", help="CPU-only pods, %% of the base's count (0-300)")


def _fraction(value: float | None) -> float | None:
    return None if value is None else value / 100


def run(args: argparse.Namespace) -> int:
    from scheduler_plugin.sim.trace import TraceError, read_nodes, read_pods, write_pods
    from scheduler_plugin.sim.variants import LIMITS, VariantError, VariantSpec, make_variant, stats

    out = Path(args.out).resolve()
    if (_REPO / ".git").exists() and out.is_relative_to(_REPO):
        print(
            f"fgpuctl trace-variant: --out {args.out} is inside the repository {_REPO}; "
            "write variants elsewhere (e.g. /tmp), the trace's data stays out of the repository",
            file=sys.stderr,
        )
        return 2
    for flag, axis in (("--constrained", "constrained"), ("--sharing", "sharing"), ("--multi-gpu", "multi_gpu"), ("--cpu-only", "cpu_only")):
        value = getattr(args, axis)
        low, high = (100 * bound for bound in LIMITS[axis])
        if value is not None and not low <= value <= high:
            print(f"fgpuctl trace-variant: {flag} {value:g} is out of range; give a percent in {low:g}..{high:g}", file=sys.stderr)
            return 2
    try:
        spec = VariantSpec(
            constrained=_fraction(args.constrained),
            sharing=_fraction(args.sharing),
            multi_gpu=_fraction(args.multi_gpu),
            cpu_only=_fraction(args.cpu_only),
            seed=args.seed,
        )
        nodes = read_nodes(args.nodes)
        base = read_pods(args.pods)
        source = read_pods(args.constraints_from) if args.constraints_from else None
        pods = make_variant(base, nodes=nodes, spec=spec, constraint_source=source)
    except (TraceError, VariantError) as error:
        print(f"fgpuctl trace-variant: {error}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    write_pods(out, pods)
    for name, measured in (("base", stats(base)), ("variant", stats(pods))):
        print(
            f"{name:>7}: {measured.pods} pods ({measured.cpu_only_pods} CPU-only), GPU request {measured.gpu_milli / 1000:.1f} GPUs; "
            f"of GPU pods {measured.constrained:.1%} constrained, {measured.sharing:.1%} sharing, "
            f"{measured.multi_gpu:.1%} multi-GPU"
        )
    print(f"wrote {out}")
    return 0
