"""The web view without a browser: the JSON document, search, history, HTTP and the CLI's guard rails."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fgpuctl import ui_model, ui_plan, ui_render, ui_server, ui_sources
from fgpuctl.main import main as fgpuctl
from tests.webview.conftest import SEEDED


def get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_cluster_json_and_the_page_show_the_same_pods_and_forbid_scripts(seeded_url: str) -> None:
    status, headers, body = get(seeded_url + "/cluster.json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    on_gpu = {(n["name"], g["index"]): [f"{p['namespace']}/{p['name']}" for p in g["pods"]] for n in doc["nodes"] for g in n["gpus"]}
    assert on_gpu[("gpu-a", 0)] == ["team-a/train-0", "team-b/infer-1"]
    assert doc["cluster"]["fragmentationPercent"] is not None and doc["pending"]["reachable"]
    status, headers, page = get(seeded_url + "/")
    assert status == 200 and "script-src" not in headers["Content-Security-Policy"]
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert b"<img" not in page and b"evil/&lt;img src=x onerror=alert(1)&gt;" in page


def test_unknown_paths_and_bad_query_values_get_a_clear_error(seeded_url: str) -> None:
    assert get(seeded_url + "/admin")[0] == 404
    status, _, body = get(seeded_url + "/cluster.json?page=zero")
    assert status == 400 and "page='zero'" in json.loads(body)["error"]
    status, _, body = get(seeded_url + "/?per_page=%3Cb%3E")
    assert status == 400 and b"per_page=&#x27;&lt;b&gt;&#x27;" in body


def seeded_document() -> dict[str, Any]:
    """The seeded snapshot's document with its plan, made in this process."""
    gathered = ui_sources.from_snapshot_file(str(SEEDED))()
    assert gathered.planning is not None
    plan = ui_model.PlanStatus(ui_model.PlanState.CURRENT, plan=ui_plan.plan_json(gathered.planning, ui_plan.DefragShape()))
    return ui_model.document(gathered, history=(), now=0.0, plan=plan)


def test_search_narrows_nodes_pending_pods_and_moves_by_namespace_pod_and_model() -> None:
    doc = seeded_document()

    by_ns = ui_model.filtered(doc, ui_model.Query(namespace="TEAM-C"))
    assert by_ns["nodes"] == [] and [p["name"] for p in by_ns["pending"]["pods"]] == ["needs-h100", "wide-job"]
    by_pod = ui_model.filtered(doc, ui_model.Query(pod="infer-3"))
    assert [n["name"] for n in by_pod["nodes"]] == ["gpu-b"] and [m["pod"] for m in by_pod["defrag"]["moves"]] == ["team-b/infer-3"]
    by_model = ui_model.filtered(doc, ui_model.Query(model="a100"))
    assert [n["name"] for n in by_model["nodes"]] == ["gpu-a", "gpu-b"] and by_model["query"]["matchingNodes"] == 2


def test_nodes_are_paged_and_the_page_links_to_the_next() -> None:
    doc = ui_model.document(ui_sources.from_snapshot_file(str(SEEDED))(), history=(), now=0.0)

    second = ui_model.filtered(doc, ui_model.parse_query({"per_page": ["2"], "page": ["2"]}))
    assert [n["name"] for n in second["nodes"]] == ["gpu-c"] and second["query"]["pages"] == 2
    first = ui_render.page(ui_model.filtered(doc, ui_model.parse_query({"per_page": ["2"]})))
    assert "href='/?per_page=2&amp;page=2' rel=next" in first


def test_history_is_bounded_and_a_failed_refresh_keeps_the_last_sample() -> None:
    gathered = ui_sources.from_snapshot_file(str(SEEDED))()
    calls = {"n": 0}
    clock = {"t": 1000.0}

    def collect() -> ui_model.Gathered:
        calls["n"] += 1
        if calls["n"] == 6:
            raise ui_sources.SourceError("--scheduler=x: UNAVAILABLE")
        return gathered

    state = ui_server.ViewState(collect, interval_s=60, history_s=180, clock=lambda: clock["t"])
    for _ in range(6):
        state.refresh()
        clock["t"] += 60
    doc = state.document()
    assert [s["t"] for s in doc["history"]] == [1060.0, 1120.0, 1180.0, 1240.0]
    assert any("refresh failed" in n and "UNAVAILABLE" in n for n in doc["notes"])


def test_the_view_listens_beyond_loopback_only_with_mutual_tls(capsys: pytest.CaptureFixture[str]) -> None:
    assert fgpuctl(["ui", "--snapshot", str(SEEDED), "--listen", "0.0.0.0:0"]) == 2
    err = capsys.readouterr().err
    assert "--listen='0.0.0.0:0'" in err and "--tls-cert/--tls-key/--tls-client-ca" in err


def test_a_snapshot_that_cannot_be_read_is_one_line_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": []}')
    assert fgpuctl(["ui", "--snapshot", str(bad), "--listen", "127.0.0.1:0"]) == 1
    assert capsys.readouterr().err.startswith(f"fgpuctl ui: --snapshot={bad}: snapshot: 'nodes' is empty")


def test_the_simulators_svg_plot_is_drawn_by_the_history_charts_code(tmp_path: Path, seeded_url: str) -> None:
    from scheduler_plugin.sim.plotting import PALETTE, plot_curves

    out = tmp_path / "curves.svg"
    plot_curves({"fgpu": [(0.0, 0.0), (50.0, 49.0), (100.0, 90.0)], "<b>": [(0.0, 0.0), (100.0, 80.0)]}, path=str(out))
    figure = out.read_text()
    page = get(seeded_url + "/")[2].decode()
    for drawn in (figure, page):
        assert '<svg class="chart"' in drawn and f'stroke="{PALETTE[0]}"' in drawn
    assert "&lt;b&gt;" in figure and "<b>" not in figure
