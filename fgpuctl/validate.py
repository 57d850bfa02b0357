"""`fgpuctl validate`: check Pod manifests and print their normalized GPU requests.

Reads YAML or JSON (several documents separated by `---`, or a `kind: List`, or a
typed list as the API returns one: PodList, DeploymentList, ...)
from files or stdin and prints one JSON object per pod, one per line:

    {"pod": "default/train", "valid": true, "request": {"gpus": 1, "core_percent": 50, ...}}
    {"pod": "default/bad", "valid": false, "errors": ["container \\"main\\": ..."]}

Workloads (Deployment, Job, CronJob, ...) are checked through their pod
template, and their line carries "kind". Exit status: 0 when every pod is
valid, 1 when any is invalid, 2 when the input or the rules cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import yaml

from apis import pod_check
from apis.pods import pod_key
from apis.quoting import SHOWN_MAX, quoted
from apis.translation import RulesError, TranslationRules

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2

#: kind -> path to the pod template inside the object.
_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "PodTemplate": ("template",),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


class InputError(Exception):
    """Input that is not a readable manifest."""


@dataclass(frozen=True)
class Manifest:
    """A pod to check: the pod (or a workload's template as a pod), named as the object is."""

    key: str
    kind: str
    pod: Mapping[str, Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--filename", action="append", dest="files", metavar="FILE",
        help="manifest file (YAML or JSON); '-' or none reads stdin; may be repeated",
    )
    parser.add_argument("--rules", metavar="FILE", help="translation rules YAML (default: the built-in rules)")


def run(args: argparse.Namespace) -> int:
    if not args.files and sys.stdin.isatty():  # else a bare `fgpuctl validate` would wait without a word
        print("fgpuctl validate: reading manifests from stdin (end with Ctrl-D; -f FILE reads a file)", file=sys.stderr)
    return validate(files=args.files or ["-"], rules_path=args.rules, stdin=sys.stdin, out=sys.stdout, err=sys.stderr)


def validate(*, files: list[str], rules_path: str | None, stdin: TextIO, out: TextIO, err: TextIO) -> int:
    try:
        rules = TranslationRules.load(rules_path) if rules_path else TranslationRules.default()
    except RulesError as exc:
        print(f"fgpuctl validate: {exc}", file=err)
        return EXIT_UNREADABLE
    try:
        manifests = [m for name in files for m in _manifests(_read(name, stdin), name, err)]
    except InputError as exc:
        print(f"fgpuctl validate: {exc}", file=err)
        return EXIT_UNREADABLE
    if not manifests:
        print(f"fgpuctl validate: no Pod found in {', '.join(files)}", file=err)
        return EXIT_UNREADABLE
    status = EXIT_VALID
    for manifest in manifests:
        result = check(manifest, rules=rules)
        if not result["valid"]:
            status = EXIT_INVALID
        out.write(json.dumps(result) + "\n")
    out.flush()
    return status


def check(manifest: Manifest, *, rules: TranslationRules) -> dict[str, object]:
    """One output line: the normalized request, or every error found."""
    result: dict[str, object] = {"pod": manifest.key}
    if manifest.kind != "Pod":
        result["kind"] = manifest.kind
    verdict = pod_check.check_pod(manifest.pod, rules=rules)  # the admission webhook's check too
    if not verdict.valid:
        result.update(valid=False, errors=list(verdict.errors))
    else:
        result.update(valid=True, request=verdict.request.to_json() if verdict.request is not None else None)
    return result


def _read(name: str, stdin: TextIO) -> str:
    if name == "-":
        return stdin.read()
    try:
        with open(name, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not text (UTF-8): {exc}") from exc


def _manifests(text: str, name: str, err: TextIO) -> Iterator[Manifest]:
    # JSON is YAML, so one parser reads both; safe_load_all splits on `---`.
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: not valid YAML or JSON: {_yaml_problem(exc)}") from exc
    for index, document in enumerate(documents):
        yield from _objects(document, f"{name}: document {index + 1}", err)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's complaint on one line, with the line and column it points at (its own text spans
    several lines and quotes "<unicode string>" for the place)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = " ".join(part for part in (exc.context, exc.problem) if part)
        return f"line {mark.line + 1}, column {mark.column + 1}: {' '.join(what.split())}"
    return " ".join(str(exc).split())


def _is_list(kind: object, obj: Mapping[str, Any]) -> bool:
    """A List, or a typed list as the API returns one (PodList, DeploymentList, ...), or a bare `items`."""
    if kind is None:
        return isinstance(obj.get("items"), list)
    return isinstance(kind, str) and kind.endswith("List") and "items" in obj


def _objects(obj: object, where: str, err: TextIO) -> Iterator[Manifest]:
    if not isinstance(obj, Mapping):
        raise InputError(f"{where}: expected a Kubernetes object (a mapping with kind), got {type(obj).__name__}")
    kind = obj.get("kind")
    if _is_list(kind, obj):
        items = obj.get("items")
        if not isinstance(items, list):
            raise InputError(f"{where}: a {_shown(str(kind))} needs 'items: [...]'")
        for index, item in enumerate(items):
            yield from _objects(item, f"{where} items[{index}]", err)
        return
    if kind == "Pod" or (kind is None and isinstance(obj.get("spec"), Mapping) and "containers" in obj["spec"]):
        yield Manifest(key=pod_key(obj), kind="Pod", pod=obj)
        return
    path = _TEMPLATE_PATHS.get(str(kind))
    template = _dig(obj, path) if path else None
    if not isinstance(template, Mapping):
        what = "an object without kind" if kind is None else _shown(str(kind))
        print(f"fgpuctl validate: {where}: skipped {what} {_shown(pod_key(obj))}: not a Pod and has no pod template", file=err)
        return
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    yield Manifest(key=pod_key({"metadata": meta}), kind=str(kind), pod=template)


def _shown(value: str) -> str:
    """A manifest's kind or name for a message: bare when plain, else quoted, escaped and cut (the file may be anyone's)."""
    plain = value and value.isprintable() and len(value) <= SHOWN_MAX and not any(c in value for c in " '\"")
    return value if plain else quoted(value)


def _dig(obj: Mapping[str, Any], path: tuple[str, ...]) -> object:
    current: object = obj
    for step in path:
        if not isinstance(current, Mapping):
            return None
        current = current.get(step)
    return current
