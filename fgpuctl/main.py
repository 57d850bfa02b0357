"""fgpuctl entry point: dispatches `fgpuctl VERB ...` to the module that owns the verb.

Each verb lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; every verb module is imported to build the parser, so each
imports its heavy dependencies inside `run`, where they never slow down the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "validate": ("fgpuctl.validate", "check Pod manifests and print their normalized GPU requests"),
    "inspect": ("fgpuctl.inspect", "per node and GPU: model, health, allocated/total, pods"),
    "simulate": ("fgpuctl.simulate", "replay a production trace through the scheduler core"),
    "defrag-plan": ("fgpuctl.defrag", "propose pod moves that free whole GPUs for a pending shape"),
    "trace-variant": ("fgpuctl.trace_variant", "make a workload from a trace along the published variants' axes"),
    "keys": ("fgpuctl.keys", "make, inspect and rotate the keys that sign GPU allocations"),
    "top": ("fgpuctl.top", "per pod and GPU: GPU memory in use (the agents' metrics) beside the allocation"),
    "ui": ("fgpuctl.ui", "serve a read-only web view of the cluster's GPUs (page /, data /cluster.json)"),
    "mig": ("fgpuctl.mig", "ask a cordoned node to switch an idle GPU into or out of MIG mode"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fgpuctl", description="Operate fgpu: fine-grained GPU sharing for Kubernetes.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # verb not built in this version
        verb_parser = sub.add_parser(verb, help=help_text, description=help_text)
        module.add_arguments(verb_parser)
        verb_parser.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    return int(run(args))


if __name__ == "__main__":
    sys.exit(main())
