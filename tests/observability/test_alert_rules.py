"""The chart's alerts: promtool accepts them, its unit tests pass on them, and they read real metrics."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_chart.chart import one, render, render_error
from tests.deploy_chart.crd_kinds import custom_kind_errors
from tests.observability.exported import AWAITED
from tests.observability.promql import metric_names
from tests.observability.rendered import ON, rule_groups, run_promtool, write_rules

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("rules_test.yaml")
PLAIN_RULES = ROOT / "hack" / "deploy" / "monitoring" / "60-prometheus-rules.yaml"


def _rules(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for group in groups for rule in group["rules"]]


def _promtool_test(tmp_path: Path, groups: list[dict[str, Any]]) -> tuple[int, str]:
    write_rules(tmp_path / "rules.yaml", groups)
    shutil.copy(FIXTURE, tmp_path / "rules_test.yaml")
    result = run_promtool("test", "rules", "rules_test.yaml", cwd=tmp_path)
    return result.returncode, result.stdout + result.stderr


def test_promtool_accepts_the_deployed_rules(tmp_path: Path) -> None:
    groups = rule_groups()
    write_rules(tmp_path / "rules.yaml", groups)
    checked = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_rules(groups))} rules found" in checked.stdout


def test_the_promtool_unit_tests_pass_on_the_deployed_rules(tmp_path: Path) -> None:
    code, output = _promtool_test(tmp_path, rule_groups())
    assert code == 0, output


def test_the_promtool_unit_tests_pass_on_the_plain_manifests_rules(tmp_path: Path) -> None:
    """hack/deploy/monitoring/ is what people apply without Helm; its rules must be the tested ones."""
    (obj,) = [d for d in yaml.safe_load_all(PLAIN_RULES.read_text()) if d]
    assert obj["kind"] == "PrometheusRule" and custom_kind_errors(obj) == []
    code, output = _promtool_test(tmp_path, obj["spec"]["groups"])
    assert code == 0, output


def test_the_unit_tests_notice_another_pending_threshold(tmp_path: Path) -> None:
    groups = rule_groups({"metrics": {"prometheusRule": {"enabled": True, "pendingMinutes": 30}}})
    code, output = _promtool_test(tmp_path, groups)
    assert code != 0 and "FgpuGPUPodsPendingWhileFragmented" in output


def test_every_alert_names_only_metrics_a_daemon_exports(exported: set[str]) -> None:
    unknown = [
        f"{rule['alert']}: {name}"
        for rule in _rules(rule_groups())
        for name in sorted(metric_names(rule["expr"]))
        if name not in exported and name not in AWAITED
    ]
    assert unknown == []


def test_every_condition_docs_deploy_names_has_an_alert() -> None:
    text = (ROOT / "docs/deploy.md").read_text()
    sentence = text[text.index("Worth an alert:"):]
    sentence = sentence[: sentence.index("\n\n")]
    named = set(re.findall(r"`[^`]*?(fgpu_[a-z_]+)[^`]*`", sentence))
    assert len(named) >= 6, named
    alerted = set().union(*(metric_names(rule["expr"]) for rule in _rules(rule_groups())))
    assert sorted(named - alerted) == []


def test_pending_while_fragmented_reads_the_chart_values() -> None:
    values = {"metrics": {"prometheusRule": {"enabled": True, "pendingMinutes": 30, "fragmentationRatio": 0.25}}}
    (rule,) = [r for r in _rules(rule_groups(values)) if r["alert"] == "FgpuGPUPodsPendingWhileFragmented"]
    assert "fgpu_scheduler_oldest_pending_gpu_pod_seconds) > 1800" in rule["expr"]
    assert rule["expr"].rstrip().endswith(") > 0.25")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"pendingMinutes": 0}, "metrics.prometheusRule.pendingMinutes=0: give whole minutes, 1 or more"),
        ({"fragmentationRatio": 1.5}, "metrics.prometheusRule.fragmentationRatio=1.5: give a share of idle GPU between 0 and 1"),
    ],
)
def test_values_that_cannot_work_are_refused(setting: dict[str, Any], message: str) -> None:
    assert message in render_error({"metrics": {"prometheusRule": {"enabled": True, **setting}}})


def test_every_alert_says_how_bad_and_what_to_do() -> None:
    for rule in _rules(rule_groups()):
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_the_rules_are_off_unless_asked_for() -> None:
    assert [d.id for d in render({"metrics": {"serviceMonitor": {"enabled": True}}}) if d.kind == "PrometheusRule"] == []


def test_the_prometheus_rule_is_a_valid_object() -> None:
    assert custom_kind_errors(one(render(ON), "PrometheusRule", "fgpu")) == []


def test_the_prometheus_rule_schema_refuses_a_misspelt_field_and_a_bad_duration() -> None:
    obj = copy.deepcopy(one(render(ON), "PrometheusRule", "fgpu"))
    obj["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    obj["spec"]["groups"][1]["rules"][0]["labelz"] = {"severity": "warning"}
    errors = custom_kind_errors(obj)
    assert len(errors) == 2, errors
    assert errors[0].startswith("spec/groups/0/rules/0/for: 'ten minutes' does not match")
    assert "'labelz' was unexpected" in errors[1]
