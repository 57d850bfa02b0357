"""`kubectl fgpu`: fgpuctl as a kubectl plugin (the `kubectl-fgpu` console script on PATH).

    kubectl fgpu inspect|validate|defrag-plan|top [--kubeconfig FILE] [--context NAME] [-n NS] [-o json|yaml|wide] ...

A thin alias: each verb is fgpuctl's own (`fgpuctl.main.VERBS`), run in this process with kubectl's
flags mapped onto it. The flags may stand before or after the verb, as kubectl's do:

- `--kubeconfig FILE` and `--context NAME`: as kubectl reads them (`KUBECONFIG`, a list of files
  merged first-wins, else ~/.kube/config). With a context, the verb gets a private kubeconfig of
  the merged files with that context current (relative file paths made absolute), removed after.
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
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from fgpuctl import main as fgpuctl
from fgpuctl.top import dump

PROG = "kubectl fgpu"
#: The verbs the plugin offers, each fgpuctl's verb of the same name.
PLUGIN_VERBS = ("inspect", "validate", "defrag-plan", "top")
#: Per verb, how it is asked for its JSON (None: it prints JSON already).
_JSON_FLAG: dict[str, list[str] | None] = {"inspect": ["-o", "json"], "defrag-plan": ["--json"], "validate": None, "top": ["-o", "json"]}
_READS_API = ("inspect", "defrag-plan", "top")
#: kubeconfig fields that name files, resolved against the kubeconfig's own directory (as kubectl does).
_PATH_FIELDS = {"clusters": ("cluster", ("certificate-authority",)), "users": ("user", ("client-certificate", "client-key", "tokenFile"))}


class PluginError(Exception):
    """A flag or kubeconfig the plugin cannot use; the message says which and how to fix it."""


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
    try:
        with _kubeconfig(flags.kubeconfig, flags.context) as kubeconfig:
            args = _verb_args(verb, rest, kubeconfig=kubeconfig, namespace=flags.namespace, output=flags.output)
            if flags.output in ("json", "yaml"):
                return _structured(verb, args, flags.output)
            return fgpuctl.main([verb, *args])
    except PluginError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2


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


@contextlib.contextmanager
def _kubeconfig(path: str, context: str) -> Iterator[str]:
    """The kubeconfig path the verb gets: as given without a context; else a private merged copy."""
    if not context:
        yield path
        return
    merged = merged_kubeconfig(_kubeconfig_files(path))
    names = [str(c.get("name")) for c in merged.get("contexts") or []]
    if context not in names:
        raise PluginError(f"--context={context}: no such context in the kubeconfig; it has {', '.join(names) or 'none'}")
    merged["current-context"] = context
    with tempfile.TemporaryDirectory(prefix="kubectl-fgpu-") as directory:
        target = Path(directory) / "kubeconfig"
        target.touch(mode=0o600)  # it holds credentials
        target.write_text(yaml.safe_dump(merged, sort_keys=False))
        yield str(target)


def _kubeconfig_files(path: str) -> list[Path]:
    if path:
        return [Path(path)]
    env = os.environ.get("KUBECONFIG", "")
    files = [Path(p) for p in env.split(os.pathsep) if p] if env else [Path.home() / ".kube" / "config"]
    found = [f for f in files if f.is_file()]
    if not found:
        raise PluginError(f"no kubeconfig found ({', '.join(map(str, files))}); give --kubeconfig FILE")
    return found


def merged_kubeconfig(files: Sequence[Path]) -> dict[str, Any]:
    """kubectl's merge of several kubeconfig files: the first file to name a cluster, user or context
    (or to set current-context) wins; file paths inside are made absolute against their own file."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [], "contexts": [], "current-context": ""}
    for file in files:
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise PluginError(f"{file}: not a readable kubeconfig: {exc}") from exc
        if not isinstance(loaded, Mapping):
            raise PluginError(f"{file}: not a kubeconfig (expected a mapping with clusters, users, contexts)")
        for section in ("clusters", "users", "contexts"):
            known = {entry.get("name") for entry in merged[section]}
            for entry in loaded.get(section) or []:
                if isinstance(entry, Mapping) and entry.get("name") not in known:
                    merged[section].append(_absolute(section, dict(entry), base=file.resolve().parent))
                    known.add(entry.get("name"))
        if not merged["current-context"] and loaded.get("current-context"):
            merged["current-context"] = loaded["current-context"]
    return merged


def _absolute(section: str, entry: dict[str, Any], *, base: Path) -> dict[str, Any]:
    if section not in _PATH_FIELDS:
        return entry
    key, fields = _PATH_FIELDS[section]
    body = dict(entry.get(key) or {})
    for name in fields:
        value = body.get(name)
        if isinstance(value, str) and value and not os.path.isabs(value):
            body[name] = str(base / value)
    entry[key] = body
    return entry


if __name__ == "__main__":
    sys.exit(main())
