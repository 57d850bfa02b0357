"""The common changes stay local (docs/architecture.md, "How to add ..."): each walkthrough done as a
small real change, checked for what it reaches. The backend and policy walkthroughs live beside
their registries' tests (tests/agent/isolation_walkthrough.py, tests/scheduler_core/test_policies.py);
this file checks that they exist, and does the vendor walkthrough, which is config only."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from apis import names
from apis.request import parse_pod
from apis.translation import TranslationRules
from hack import render_manifests

ROOT = Path(__file__).resolve().parents[2]
#: A vendor fgpu has never heard of, added the way docs/translation-rules.md says: one rule.
VENDOR_RULE = """
  - name: examplegpu
    description: Example vGPU (the vendor walkthrough)
    when: {any: [example.com/vgpu-memory]}
    count: {resource: example.com/vgpu, default: 1}
    memory: {resource: example.com/vgpu-memory, unit: Mi, per: gpu}
"""


def _pod(resources: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml", "uid": "u"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": resources}}]},
    }


def test_a_vendor_is_config_only_in_standalone_and_extender_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(render_manifests.CHART, chart)
    rules_file = chart / "files" / "translation-rules.yaml"
    rules_file.write_text(rules_file.read_text() + VENDOR_RULE)

    # Standalone (and the extender's own filter): the rules file is all fgpu-scheduler reads.
    request = parse_pod(_pod({"example.com/vgpu-memory": "2048"}), rules=TranslationRules.load(str(rules_file)))
    assert request is not None, "the rule did not translate the pod"
    assert (request.source, request.gpus, request.memory_bytes) == ("examplegpu", 1, 2048 * 2**20), request
    assert "example.com/vgpu-memory" not in TranslationRules.default().resources

    # Extender mode: kube-scheduler must route the pod to fgpu, which the chart derives from the same file.
    monkeypatch.setattr(render_manifests, "CHART", chart)
    rendered = render_manifests.render_chart(render_manifests.BASE_VALUES)["20-kube-scheduler-config.yaml"]
    config = yaml.safe_load(yaml.safe_load(rendered)["data"]["config.yaml"])
    managed = [r["name"] for r in config["extenders"][0]["managedResources"]]
    assert {"example.com/vgpu", "example.com/vgpu-memory"} <= set(managed)
    assert set(managed) == set(names.KOORDINATOR_RESOURCES) | {names.NVIDIA_GPU} | TranslationRules.load(str(rules_file)).resources
    assert len(managed) == len(set(managed))


def test_the_backend_and_policy_walkthroughs_are_one_module_each_registered_by_tests() -> None:
    backend = (ROOT / "tests" / "agent" / "isolation_walkthrough.py").read_text()
    assert "register_backend(" in backend
    policies = (ROOT / "tests" / "scheduler_core" / "test_policies.py").read_text()
    assert "register_policy(" in policies


def test_the_architecture_note_lists_the_files_of_each_walkthrough() -> None:
    note = (ROOT / "docs" / "architecture.md").read_text()
    for heading in (
        "How to add an isolation backend", "How to add a scoring policy", "How to add an intercepted CRI call",
        "How to add a Device field", "How to add a vendor's resources",
    ):
        assert f"## {heading}" in note, heading
