"""The view answers only to its own address, and lists a page's worth of pending pods."""

from __future__ import annotations

import http.client
import json
from dataclasses import replace
from urllib.parse import urlsplit

import pytest

from fgpuctl import ui_sources
from fgpuctl.ui_model import Gathered, Pending, PendingPod
from fgpuctl.ui_server import allowed_hosts
from tests.webview.conftest import SEEDED, Serve


def _status(base: str, path: str, host: str | None) -> tuple[int, bytes]:
    where = urlsplit(base).netloc
    conn = http.client.HTTPConnection(where, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=host is not None)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _pending(count: int) -> Pending:
    return Pending(reachable=True, pods=tuple(
        PendingPod(namespace="team", name=f"job-{i:04d}", uid=f"uid-{i}", wants="1 GPU", summary="0/3 nodes",
                   reasons=(("busy", 3),), message="")
        for i in range(count)
    ))


@pytest.fixture(scope="module")
def many_pending() -> Gathered:
    return replace(ui_sources.from_snapshot_file(str(SEEDED))(), pending=_pending(250))


def test_allowed_hosts_are_the_bound_address_and_loopback_names_with_the_port() -> None:
    assert allowed_hosts("127.0.0.1", 8080) == {"127.0.0.1:8080", "localhost:8080", "[::1]:8080"}
    assert allowed_hosts("::1", 80) == {"[::1]:80", "localhost:80", "127.0.0.1:80", "[::1]", "localhost", "127.0.0.1"}


def test_a_foreign_or_missing_host_gets_421_and_the_own_names_are_answered(serve: Serve, many_pending: Gathered) -> None:
    base = serve(lambda: many_pending, plan=False)
    port = urlsplit(base).port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert _status(base, "/cluster.json", host)[0] == 200, host
    for host in (f"rebind.example:{port}", "127.0.0.1", f"127.0.0.1:{port + 1 if port else 1}", f"localhost.example:{port}", ""):
        status, body = _status(base, "/cluster.json", host)
        assert status == 421 and b"misdirected" in body, host
    assert _status(base, "/", "attacker.example")[0] == 421


def test_pending_pods_come_a_page_at_a_time_with_the_rest_counted(serve: Serve, many_pending: Gathered) -> None:
    base = serve(lambda: many_pending, plan=False)
    status, body = _status(base, "/cluster.json?per_page=10", None)
    pending = json.loads(body)["pending"]
    assert status == 200 and [p["name"] for p in pending["pods"]] == [f"job-{i:04d}" for i in range(10)]
    assert pending["more"] == 240
    # The default page size, and a search that narrows them below it.
    assert json.loads(_status(base, "/cluster.json", None)[1])["pending"]["more"] == 150
    narrowed = json.loads(_status(base, "/cluster.json?pod=job-001", None)[1])["pending"]
    assert len(narrowed["pods"]) == 10 and narrowed["more"] == 0
    page = _status(base, "/?per_page=10", None)[1].decode()
    assert page.count("class=pending-pod") == 10 and "240 more pending pods" in page
    assert "more pending pod" not in _status(base, "/?pod=job-001", None)[1].decode()
