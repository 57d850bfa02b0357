"""The agent spells no wire name of its own: every one comes from apis.names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from apis import names

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "agent").rglob("*.py")), ROOT / "bench" / "agent.py"]
#: Resource names of other device plugins the agent reads from kubelet's checkpoint.
RESOURCE_NAMES = (names.NVIDIA_GPU, names.NVIDIA_MIG_RESOURCE_PREFIX)


def _string_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nvidia_resource_names_are_taken_from_apis_names(path: Path) -> None:
    spelled = [s for s in _string_literals(path) if any(s.startswith(name) for name in RESOURCE_NAMES)]
    assert spelled == [], f"{path.name} spells {spelled}; use apis.names.NVIDIA_GPU / NVIDIA_MIG_RESOURCE_PREFIX"
