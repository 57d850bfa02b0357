"""The chart's alerts: promtool accepts them, its unit tests pass on them, and they read real metrics."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests.deploy_chart.chart import one, render, render_error
from tests.observability.exported import AWAITED
from tests.observability.promql import metric_names
from tests.observability.rendered import ON, rule_groups, run_promtool, write_rules

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("rules_test.yaml")


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


#: monitoring.coreos.com/v1 PrometheusRule, the fields the chart writes (the Operator's CRD schema, transcribed).
_STR = {"type": "string"}
_MAP = {"type": "object", "additionalProperties": _STR}
PROMETHEUS_RULE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name", "namespace"],
                     "properties": {"name": _STR, "namespace": _STR, "labels": _MAP}, "additionalProperties": False},
        "spec": {"type": "object", "required": ["groups"], "additionalProperties": False, "properties": {"groups": {
            "type": "array", "minItems": 1, "items": {"type": "object", "required": ["name", "rules"], "additionalProperties": False,
                "properties": {"name": {"type": "string", "minLength": 1}, "interval": _STR, "rules": {"type": "array", "items": {
                    "type": "object", "required": ["expr"], "additionalProperties": False,
                    "properties": {"alert": _STR, "record": _STR, "expr": _STR, "labels": _MAP, "annotations": _MAP,
                                   "for": {"type": "string", "pattern": r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}},
                }}},
            }}}},
    },
    "additionalProperties": False,
}


def test_the_prometheus_rule_is_a_valid_object() -> None:
    obj = one(render(ON), "PrometheusRule", "fgpu")
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in jsonschema.Draft202012Validator(PROMETHEUS_RULE).iter_errors(obj)]
    assert errors == []
