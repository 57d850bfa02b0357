"""`--kubeconfig FILE --context NAME` as kubectl reads them, for every fgpuctl verb that reads the API.

The Kubernetes client takes a kubeconfig file and uses its current context; kubectl also takes
`--context`. So with a context a verb gets a private kubeconfig: the files kubectl would read
(`--kubeconfig`, else `KUBECONFIG`, a list of files merged first-wins, else ~/.kube/config), merged
as kubectl merges them, with that context current and the file paths inside made absolute. It is
mode 0600 (it holds credentials) and removed once the verb is done.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

#: kubeconfig fields that name files, resolved against the kubeconfig's own directory (as kubectl does).
_PATH_FIELDS = {"clusters": ("cluster", ("certificate-authority",)), "users": ("user", ("client-certificate", "client-key", "tokenFile"))}


class ContextError(Exception):
    """A context or kubeconfig that cannot be used; the message says which and how to fix it."""


def add_flag(parser: argparse.ArgumentParser) -> None:
    """`--context NAME`, beside the verb's `--kubeconfig`."""
    parser.add_argument(
        "--context", metavar="NAME", default="",
        help="the kubeconfig context to use, as kubectl's --context (default: the current context)",
    )


def shown(args: argparse.Namespace) -> str:
    """How an error names the cluster a verb read: the context when one was given (the kubeconfig path is
    then a private copy the operator never saw), else the kubeconfig flag."""
    context = getattr(args, "context", "")
    return f"--context={context}" if context else f"--kubeconfig={getattr(args, 'kubeconfig', '') or '(default)'}"


@contextlib.contextmanager
def selected(path: str, context: str) -> Iterator[str]:
    """The kubeconfig path to give the client: `path` as given without a context; else a private merged copy."""
    if not context:
        yield path
        return
    merged = merged_kubeconfig(kubeconfig_files(path))
    names = [str(c.get("name")) for c in merged.get("contexts") or [] if isinstance(c, Mapping)]
    if context not in names:
        raise ContextError(f"--context={context}: no such context in the kubeconfig; it has {', '.join(names) or 'none'}")
    merged["current-context"] = context
    with tempfile.TemporaryDirectory(prefix="fgpuctl-") as directory:
        target = Path(directory) / "kubeconfig"
        target.touch(mode=0o600)  # it holds credentials
        target.write_text(yaml.safe_dump(merged, sort_keys=False))
        yield str(target)


def kubeconfig_files(path: str) -> list[Path]:
    """The files kubectl would read: `path`, else each file of KUBECONFIG that exists, else ~/.kube/config."""
    if path:
        return [Path(path)]
    env = os.environ.get("KUBECONFIG", "")
    files = [Path(p) for p in env.split(os.pathsep) if p] if env else [Path.home() / ".kube" / "config"]
    found = [f for f in files if f.is_file()]
    if not found:
        raise ContextError(f"no kubeconfig found ({', '.join(map(str, files))}); give --kubeconfig FILE")
    return found


def merged_kubeconfig(files: Sequence[Path]) -> dict[str, Any]:
    """kubectl's merge of several kubeconfig files: the first file to name a cluster, user or context
    (or to set current-context) wins; file paths inside are made absolute against their own file."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [], "contexts": [], "current-context": ""}
    for file in files:
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except (OSError, UnicodeDecodeError) as exc:
            raise ContextError(f"{file}: not a readable kubeconfig: {getattr(exc, 'strerror', None) or exc}") from exc
        except yaml.YAMLError as exc:
            raise ContextError(f"{file}: not a readable kubeconfig: {' '.join(str(exc).split())}") from exc
        if not isinstance(loaded, Mapping):
            raise ContextError(f"{file}: not a kubeconfig (expected a mapping with clusters, users, contexts)")
        for section in ("clusters", "users", "contexts"):
            known = {entry.get("name") for entry in merged[section]}
            entries = loaded.get(section) or []
            for entry in entries if isinstance(entries, list) else []:
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
    body = dict(entry.get(key) or {}) if isinstance(entry.get(key), Mapping) else {}
    for name in fields:
        value = body.get(name)
        if isinstance(value, str) and value and not os.path.isabs(value):
            body[name] = str(base / value)
    entry[key] = body
    return entry
