"""The dashboard and the alert rules as the chart deploys them, and promtool to check them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_chart.chart import one, render

ON = {"metrics": {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}}


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the dashboard, and where it is."""

    where: str
    expr: str


def dashboard(values: dict[str, Any] | None = None) -> dict[str, Any]:
    config_map = one(render(values or ON), "ConfigMap", "fgpu-grafana-dashboard")
    loaded: dict[str, Any] = json.loads(config_map["data"]["fgpu.json"])
    return loaded


def rule_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = one(render(values or ON), "PrometheusRule", "fgpu")["spec"]["groups"]
    return groups


def dashboard_queries(board: dict[str, Any]) -> list[Query]:
    """Every expression in panels (rows' nested panels too) and in the template variables."""
    found: list[Query] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                found.append(Query(f"panel {panel['title']!r} {target['refId']}", target["expr"]))
            walk(panel.get("panels", []))

    walk(board["panels"])
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = re.fullmatch(r"\s*(?:label_values|query_result)\((.*?)(?:,\s*\w+)?\)\s*", query)
        assert match, f"variable {variable['name']}: unreadable query {query!r}"
        found.append(Query(f"variable ${variable['name']}", match.group(1)))
    return found


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            raise AssertionError("promtool is missing; .ci/run installs Debian's prometheus package")
        pytest.skip("promtool is not installed (Debian's prometheus package; .ci/run installs it)")
    return path


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def write_rules(path: Path, groups: list[dict[str, Any]]) -> None:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
