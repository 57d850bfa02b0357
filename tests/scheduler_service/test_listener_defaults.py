"""Where the scheduler listens unless told otherwise, and what its probe/metrics listener serves."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apis import grpc_server
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.config import SchedulerConfig, StateBackend
from tests.scheduler_service import cluster


def start(tmp_path: Path, key_file: str, **listeners: Any) -> SchedulerApp:
    settings: dict[str, Any] = {"grpc_listen": "", **listeners}
    app = SchedulerApp(
        SchedulerConfig(state=StateBackend.EMBEDDED, db=str(tmp_path / "s.db"), signing_key=key_file, **settings),
        timing=cluster.FAST,
    )
    app.start()
    return app


def get(port: int, path: str, *, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_by_default_grpc_is_a_unix_socket_and_nothing_listens_on_tcp() -> None:
    config = SchedulerConfig()

    assert grpc_server.parse_address(config.grpc_listen).unix_path is not None
    assert config.extender_listen == "" and config.metrics_listen == ""


def test_an_extender_address_without_a_host_listens_on_loopback(tmp_path: Path, key_file: str) -> None:
    app = start(tmp_path, key_file, extender_listen=":0")
    try:
        assert app.extender is not None and app.extender.address[0] == "127.0.0.1"
    finally:
        app.stop(1.0)


@pytest.fixture
def probes_port(tmp_path: Path, key_file: str) -> Iterator[int]:
    app = start(tmp_path, key_file, metrics_listen=":0")
    assert app.probes is not None
    assert app.probes.address[0] == "127.0.0.1"  # no host: loopback here too
    yield app.probes.port
    app.stop(1.0)


def test_the_metrics_listener_answers_kubelets_probes_and_prometheus(probes_port: int) -> None:
    assert get(probes_port, "/healthz") == (200, b"ok")
    assert get(probes_port, "/readyz") == (200, b"ok")
    status, metrics = get(probes_port, "/metrics")
    assert status == 200 and b"fgpu_scheduler_is_leader" in metrics


def test_the_metrics_listener_serves_no_extender_verb(probes_port: int) -> None:
    # It may face the pod network without TLS only because nothing on it decides or binds.
    for verb in ("filter", "prioritize", "bind"):
        assert get(probes_port, f"/fgpu/{verb}", method="POST")[0] == 404


def test_stopping_the_scheduler_closes_the_metrics_listener(tmp_path: Path, key_file: str) -> None:
    app = start(tmp_path, key_file, metrics_listen="127.0.0.1:0")
    assert app.probes is not None
    port = app.probes.port

    app.stop(1.0)

    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
