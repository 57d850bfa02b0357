"""`kubectl fgpu`: fgpuctl as a kubectl plugin (the `kubectl-fgpu` console script on PATH).

    kubectl fgpu inspect|validate|defrag-plan|top [--kubeconfig FILE] [--context NAME] [-n NS] [-o json|yaml|wide] ...

A thin alias: each verb is fgpuctl's own (`fgpuctl.main.VERBS`), run in this process with kubectl's
flags mapped onto it. The flags may stand before or after the verb, as kubectl's do:

- `--kubeconfig FILE` and `--context NAME`: as kubectl reads them (`KUBECONFIG`, a list of files
  merged first-wins, else ~/.kube/config). With a context, the verb gets a private kubeconfig of
  the merged files with that context current (fgpuctl/kubecontext.py), removed after. Only the
  verbs that read the API use them: `validate` reads files and needs no kubeconfig.
- `-n/--namespace`: `top` shows that namespace's pods; the others read cluster-wide state
  (nodes, GPUs), so like kubectl on cluster-scoped resources they ignore it.
- `-o json|yaml|wide`: the verb's JSON (inspect `-o json`, defrag-plan `--json`, validate's JSON
  lines as one list) printed as JSON or YAML; `wide` and no `-o` print the verb's own text.

Every other argument goes to the verb unchanged (`kubectl fgpu defrag-plan --gpus 8`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Sequence
from typing import Any

from fgpuctl import kubecontext
from fgpuctl import main as fgpuctl
from fgpuctl.top import dump

PROG = "kubectl fgpu"
#: The verbs the plugin offers, each fgpuctl's verb of the same name.
PLUGIN_VERBS = ("inspect", "validate", "defrag-plan", "top")
#: Per verb, how it is asked for its JSON (None: it prints JSON already).
_JSON_FLAG: dict[str, list[str] | None] = {"inspect": ["-o", "json"], "defrag-plan": ["--json"], "validate": None, "top": ["-o", "json"]}
_READS_API = ("inspect", "defrag-plan", "top")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    parser.add_argument("--kubeconfig", default="")
    parser.add_argument("--context", default="")
    parser.add_argument("-n", "--namespace", default="")
    parser.add_argument("-o", "--output", default="", choices=["json", "yaml", "wide"])
    parser.add_argument("-h", "--help", action="store_true")
    return parser


def usage() -> str:
    lines = [f"usage: {PROG} VERB [--kubeconfig FILE] [--context NAME] [-n NAMESPACE] [-o json|yaml|wide] [ARGS...]", "", "verbs:"]
    lines += [f"  {verb:12} {fgpuctl.VERBS[verb][1]}" for verb in PLUGIN_VERBS]
    lines += ["", f"`{PROG} VERB --help` lists a verb's own arguments (they are fgpuctl's)."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    flags, rest = _parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    verb = next((a for a in rest if not a.startswith("-")), "")
    if not verb:
        print(usage(), end="", file=sys.stdout if flags.help else sys.stderr)
        return 0 if flags.help else 2
    if verb not in PLUGIN_VERBS:
        print(f"{PROG}: unknown verb {verb!r}; choose from {', '.join(PLUGIN_VERBS)}", file=sys.stderr)
        return 2
    rest.remove(verb)
    if flags.help:
        rest.append("--help")
    # kubectl's global flags may come with any verb (aliases, wrappers); only a verb that reads the
    # API needs the kubeconfig they pick, so a verb that reads files does not fail for want of one.
    selected = kubecontext.selected(flags.kubeconfig, flags.context) if verb in _READS_API else contextlib.nullcontext("")
    try:
        with selected as kubeconfig:
            args = _verb_args(verb, rest, kubeconfig=kubeconfig, namespace=flags.namespace, output=flags.output)
            if flags.output in ("json", "yaml"):
                return _structured(verb, args, flags.output)
            return fgpuctl.main([verb, *args])
    except kubecontext.ContextError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (`| head`): end quietly, as kubectl does
        return fgpuctl.reader_left()


def _verb_args(verb: str, rest: list[str], *, kubeconfig: str, namespace: str, output: str) -> list[str]:
    args = list(rest)
    if kubeconfig and verb in _READS_API:
        args = ["--kubeconfig", kubeconfig, *args]
    if verb == "top":
        if namespace:
            args = ["--namespace", namespace, *args]
        if output == "wide":
            args = ["-o", "wide", *args]
    if output in ("json", "yaml"):
        args += _JSON_FLAG[verb] or []
    return args


def _structured(verb: str, args: list[str], output: str) -> int:
    """Runs the verb for its JSON and prints that as `output`; its error lines pass through."""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        code = fgpuctl.main([verb, *args])
    text = captured.getvalue()
    if not text.strip():
        return code
    try:
        if verb == "validate":  # one JSON object per line; kubectl prints a List
            doc: Any = {"apiVersion": "v1", "kind": "List", "items": [json.loads(line) for line in text.splitlines() if line.strip()]}
        else:
            doc = json.loads(text)
    except json.JSONDecodeError:
        print(text, end="")  # --help, or text the verb printed instead of JSON
        return code
    print(dump(doc, output), end="")
    return code


if __name__ == "__main__":
    sys.exit(main())
