"""docs/requesting-gpus.md: its examples are valid pods, its wrong ones fail with the errors it quotes,
and its reference table names exactly the pod-facing names of apis/names.py and the translation rules."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from apis import names
from apis.request import RequestError
from apis.translation import TranslationRules
from fgpuctl import validate
from scheduler_plugin.core.podrequest import pod_request_from_pod

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "requesting-gpus.md").read_text()
EXAMPLES = ROOT / "examples" / "pods" / "guide"
GOOD = sorted(EXAMPLES.glob("*.yaml"))
WRONG = sorted((EXAMPLES / "wrong").glob("*.yaml"))
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())


def _validate(path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = validate.validate(files=[str(path)], rules_path=None, stdin=io.StringIO(), out=out, err=err)
    return code, out.getvalue() + err.getvalue()


def _pods(path: Path) -> list[dict[str, Any]]:
    """Each pod of the file as the scheduler sees it: a Pod, or a workload's template as a pod of its namespace."""
    pods = []
    for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
        if doc["kind"] == "Pod":
            pods.append(doc)
        else:
            template = doc["spec"]["template"]
            meta = {**template.get("metadata", {}), "namespace": doc["metadata"]["namespace"], "name": doc["metadata"]["name"]}
            pods.append({"metadata": meta, "spec": template["spec"]})
    return pods


def _scheduler_errors(path: Path) -> list[str]:
    errors = []
    for pod in _pods(path):
        try:
            pod_request_from_pod(pod)
        except RequestError as exc:
            errors += exc.errors
    return errors


@pytest.mark.parametrize("path", GOOD + WRONG, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
@pytest.mark.parametrize("version", VERSIONS)
def test_every_example_is_a_valid_kubernetes_object(path: Path, version: str) -> None:
    for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name}: {'.'.join(map(str, exc.path))}: {exc.message}")


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_every_example_passes_fgpuctl_validate_and_the_scheduler(path: Path) -> None:
    code, output = _validate(path)
    assert code == validate.EXIT_VALID, output
    assert _scheduler_errors(path) == []


@pytest.mark.parametrize("path", WRONG, ids=lambda p: p.name)
def test_every_wrong_example_fails_validate_and_the_scheduler_with_the_error_the_guide_quotes(path: Path) -> None:
    code, output = _validate(path)
    assert code == validate.EXIT_INVALID, output
    errors = [e for line in output.splitlines() for e in yaml.safe_load(line).get("errors", [])]
    assert errors, f"{path.name} is accepted"
    # The scheduler refuses it too, with the same lines (it would leave the pod Pending with them).
    assert sorted(_scheduler_errors(path)) == sorted(errors)
    assert f"`{path.name}`" in GUIDE, f"the guide does not show {path.name}"
    assert errors[0] in GUIDE, f"the guide does not quote {path.name}'s error:\n{errors[0]}"


def test_every_example_file_is_named_in_the_guide() -> None:
    for path in GOOD:
        assert f"`{path.name}`" in GUIDE, path.name


def _reference_names() -> set[str]:
    section = GUIDE[GUIDE.index("## Reference"):GUIDE.index("## What the container sees")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])}


def test_the_reference_table_names_every_pod_facing_name_and_only_real_ones() -> None:
    table = _reference_names()
    rule_resources = {r for rule in TranslationRules.default().rules for r in rule.resources}
    assert sorted(set(names.POD_FACING) - table) == []
    assert sorted(rule_resources - table) == []
    assert sorted(table - set(names.POD_FACING) - rule_resources) == []


def test_the_container_table_names_every_variable_the_hook_sets_for_the_pod() -> None:
    section = GUIDE[GUIDE.index("## What the container sees"):GUIDE.index("## Examples")]
    listed = set(re.findall(r"^\| `([A-Z_]+)`", section, flags=re.M))
    assert listed == set(names.POD_VISIBLE_ENV)


def test_the_readme_links_the_guide() -> None:
    assert "(docs/requesting-gpus.md)" in (ROOT / "README.md").read_text()
