"""The Grafana dashboard reads only metrics the daemons export, in PromQL promtool accepts."""

from __future__ import annotations

import json
from pathlib import Path

from tests.observability.exported import AWAITED
from tests.observability.promql import grafana_to_promql, metric_names
from tests.observability.rendered import dashboard, dashboard_queries, run_promtool, write_rules

ROOT = Path(__file__).resolve().parents[2]


def test_every_dashboard_query_names_only_metrics_a_daemon_exports(exported: set[str]) -> None:
    unknown = [
        f"{q.where}: {name}"
        for q in dashboard_queries(dashboard())
        for name in sorted(metric_names(q.expr))
        if name not in exported and name not in AWAITED
    ]
    assert unknown == []


def test_the_awaited_metrics_are_not_exported_yet(exported: set[str]) -> None:
    # Once a daemon exports one, drop it from AWAITED so the lint checks it like the others.
    assert sorted(set(AWAITED) & exported) == []


def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    queries = dashboard_queries(dashboard())
    rules = [{"record": f"fgpu:dashboard_query_{i}", "expr": grafana_to_promql(q.expr)} for i, q in enumerate(queries)]
    write_rules(tmp_path / "queries.yaml", [{"name": "dashboard", "rules": rules}])
    checked = run_promtool("check", "rules", "queries.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_the_dashboard_shows_what_a_platform_engineer_asks_first() -> None:
    read = set().union(*(metric_names(q.expr) for q in dashboard_queries(dashboard())))
    for topic, metric in [
        ("allocation", "fgpu_scheduler_gpu_core_allocated_percent"),
        ("fragmentation", "fgpu_scheduler_gpu_fragmentation_milli"),
        ("pending GPU pods", "fgpu_scheduler_pending_gpu_pods"),
        ("scheduler latency", "fgpu_scheduler_phase_duration_seconds_bucket"),
        ("proxy refusals", "fgpu_runtime_proxy_refused_total"),
        ("hook errors", "fgpu_runtime_proxy_hook_errors_total"),
        ("agent health", "fgpu_agent_nvml_up"),
        ("GPU health", "fgpu_agent_gpu_healthy"),
        ("Xid", "fgpu_agent_xid_events_total"),
        ("per-pod GPU memory", "fgpu_agent_pod_gpu_memory_used_bytes"),
    ]:
        assert metric in read, f"no panel shows {topic} ({metric})"


def test_the_deployed_dashboard_is_the_file_in_the_chart_and_the_plain_manifests() -> None:
    source = json.loads((ROOT / "deploy/chart/files/grafana-dashboard.json").read_text())
    assert dashboard() == source
    import yaml

    (plain,) = [d for d in yaml.safe_load_all((ROOT / "hack/deploy/monitoring/60-grafana-dashboard.yaml").read_text()) if d]
    assert json.loads(plain["data"]["fgpu.json"]) == source


def test_the_panels_have_unique_ids_and_fit_grafanas_24_columns() -> None:
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["type"] == "row" or panel["datasource"]["uid"] == "${datasource}", panel["title"]
