"""The policy tables of docs/scheduler.md and docs/simulator.md are the registry's, written out.

Each table sits between `<!-- BEGIN generated: NAME -->` and `<!-- END generated: NAME -->`.
When a policy changes what it declares, this test fails with the table to paste; or rewrite
both tables in place with

    FGPU_UPDATE_DOCS=1 .venv/bin/python -m pytest -q tests/scheduler_core/test_policy_docs.py
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from scheduler_plugin.core.policies import DEFAULT_POLICY, PolicySpec, policy_specs

DOCS = Path(__file__).resolve().parents[2] / "docs"
UPDATE = os.environ.get("FGPU_UPDATE_DOCS") == "1"

Spec = PolicySpec[Any, Any]


def _parameters(spec: Spec) -> str:
    if not spec.params:
        return "none"
    ranges = {p.range_text for p in spec.params}
    if len(spec.params) > 1 and len(ranges) == 1 and "" not in ranges:
        rules = [f"all {ranges.pop()}"]
    else:
        rules = [f"`{p.name}` {p.range_text}" for p in spec.params if p.range_text]
    if spec.notes:
        rules.append(spec.notes)
    return "; ".join([*(f"`{p.name}` ({p.default_text}): {p.doc}" for p in spec.params), *rules])


def _options(spec: Spec) -> str:
    return "; ".join(f"`{o.name}` ({o.type_text}): {o.doc}" for o in spec.options) or "none"


def params_table(specs: Sequence[Spec]) -> str:
    rows = [f"| `{s.name}`{' (default)' if s.name == DEFAULT_POLICY else ''} | {_parameters(s)} |" for s in specs]
    return "\n".join(["| policy | parameters (default) |", "| --- | --- |", *rows])


def scoring_table(specs: Sequence[Spec]) -> str:
    rows = [f"| `{s.name}` | {s.score} | {s.share_gpu} | {_options(s)} |" for s in specs]
    return "\n".join(["| name | node score | share GPU | options |", "|---|---|---|---|", *rows])


TABLES: list[tuple[str, str, Callable[[Sequence[Spec]], str]]] = [
    ("scheduler.md", "policy parameters", params_table),
    ("simulator.md", "policy scores", scoring_table),
]


@pytest.mark.parametrize(("doc", "name", "render"), TABLES, ids=[t[1] for t in TABLES])
def test_the_docs_policy_table_is_the_registrys(doc: str, name: str, render: Callable[[Sequence[Spec]], str]) -> None:
    path = DOCS / doc
    text = path.read_text()
    block = re.compile(rf"(<!-- BEGIN generated: {name} [^\n]*-->\n)(.*?)(\n<!-- END generated: {name} -->)", re.S)
    found = block.search(text)
    assert found, f"docs/{doc} has no table between <!-- BEGIN generated: {name} ... --> and its END marker"
    expected = render(policy_specs(builtin_only=True))
    if UPDATE and found.group(2) != expected:
        path.write_text(text[: found.start(2)] + expected + text[found.end(2) :])
        return
    assert found.group(2) == expected, (
        f"docs/{doc}'s {name} table differs from what the policies declare; rerun with FGPU_UPDATE_DOCS=1 "
        f"or paste:\n{expected}"
    )


def test_the_docs_name_the_default_policy_the_registry_defines() -> None:
    example = (DOCS / "scheduler.md").read_text()
    assert re.search(rf"^policy: {DEFAULT_POLICY} +# ", example, re.M), "docs/scheduler.md's config example"
