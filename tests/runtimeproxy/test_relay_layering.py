"""Issue 14, defect 6: the relay's modules import one way, down to a state core that imports none of them.

`lint-imports` enforces the same layers (pyproject.toml); this test also runs
with pytest alone, counts imports under `if TYPE_CHECKING:` too, and keeps the
contract, the package docstring and the modules in step.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import runtimeproxy

PACKAGE = Path(runtimeproxy.__file__).parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"


def _layers() -> list[set[str]]:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (layered,) = [c for c in contracts if c["type"] == "layers" and "runtimeproxy.relay" in c["layers"]]
    return [{m.strip().removeprefix("runtimeproxy.") for m in layer.split("|")} for layer in layered["layers"]]


def _imports(module: str) -> set[str]:
    """The package modules `module` imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((PACKAGE / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "runtimeproxy":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("runtimeproxy."):
            found.add(node.module.split(".")[1])  # type: ignore[union-attr]
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("runtimeproxy.")}
    return found


def test_each_relay_module_imports_only_modules_in_layers_below_it() -> None:
    layers = _layers()
    for depth, layer in enumerate(layers):
        below = set().union(*layers[depth + 1 :])
        above_or_beside = set().union(*layers[: depth + 1])
        for module in layer:
            wrong = _imports(module) & above_or_beside
            assert not wrong, f"{module} imports {sorted(wrong)}, which are not below it"
            assert _imports(module) & set().union(*layers) <= below


def test_the_state_core_imports_nothing_of_the_relay_only_the_leaf_codecs() -> None:
    assert _imports("relay_state") <= {"calls", "h2frames", "hpack_codec"}
    for leaf in ("calls", "h2frames", "hpack_codec"):
        assert _imports(leaf) == set(), leaf


def test_the_package_docstring_says_which_module_owns_what() -> None:
    doc = runtimeproxy.__doc__ or ""
    for layer in _layers():
        for module in layer:
            assert f"`{module}`" in doc, f"runtimeproxy/__init__.py does not say what {module} owns"
