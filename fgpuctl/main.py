"""fgpuctl entry point: dispatches `fgpuctl VERB ...` to the module that owns the verb.

Each verb lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; every verb module is imported to build the parser, so each
imports its heavy dependencies inside `run`, where they never slow down the others.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
from collections.abc import Sequence

from fgpuctl import kubecontext

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


def _version() -> str:
    """The installed fgpu package's version (what a bug report should name)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fgpu")
    except PackageNotFoundError:
        return "unknown (not installed; run from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fgpuctl", description="Operate fgpu: fine-grained GPU sharing for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"fgpuctl {_version()}")
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


#: Exit status when the reader of stdout left early (`fgpuctl ... | head`): what a shell shows for SIGPIPE.
EXIT_READER_LEFT = 128 + 13


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return reader_left()


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    context = getattr(args, "context", "")
    others = [flag for flag, dest in (("--scheduler", "scheduler"), ("--snapshot", "snapshot")) if getattr(args, dest, None)]
    if context and others:
        print(f"fgpuctl {args.verb}: --context={context} picks a kubeconfig context; it does not go with {others[0]}", file=sys.stderr)
        return 2
    try:
        # Without a context this is the kubeconfig as given; with one, a private copy with it current.
        with kubecontext.selected(getattr(args, "kubeconfig", "") or "", context) as kubeconfig:
            if context:
                args.kubeconfig = kubeconfig
            code = int(run(args))
            sys.stdout.flush()  # a reader that left shows here, inside main, not at interpreter exit
            return code
    except kubecontext.ContextError as exc:
        print(f"fgpuctl {args.verb}: {exc}", file=sys.stderr)
        return 2


def reader_left() -> int:
    """Ends quietly once the reader of stdout has gone: no traceback, and no second error when Python
    flushes stdout at exit (stdout is pointed at /dev/null, the recipe of Python's signal docs)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # stdout is not a file descriptor (a test's capture): nothing is flushed to it at exit
    return EXIT_READER_LEFT


if __name__ == "__main__":
    sys.exit(main())
