"""The webhook spells no wire name of its own: annotation, label and resource names come from apis.names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "webhook").glob("*.py"))
#: What a wire name of fgpu's or Koordinator's looks like.
MARKERS = ("fgpu.io/", "koordinator.sh/", "nvidia.com/", "fgpu-scheduler", "default-scheduler")


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_no_wire_name_is_spelled_in_the_webhook(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    spelled = [
        node.value for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        and any(marker in node.value for marker in MARKERS)
    ]
    assert spelled == []
