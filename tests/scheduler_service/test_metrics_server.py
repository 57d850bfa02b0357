"""apis/metrics_server.py: the agent's and the descheduler's /metrics, served by the bounded server."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from apis.metrics_server import METRICS_LIMITS, MetricsServer


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("fgpu_test_moves", "moves made", ["reason"], registry=registry).labels(reason="room").inc(3)
    return registry


@pytest.fixture
def server(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    server = MetricsServer(registry, host="127.0.0.1", port=0, name="test-metrics")
    server.start()
    yield server
    server.stop(1.0)


def test_get_metrics_answers_what_prometheus_client_would(server: MetricsServer, registry: CollectorRegistry) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"] == CONTENT_TYPE_LATEST
        body = answer.read()
    assert body == generate_latest(registry)
    samples = {s.name: s for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert samples["fgpu_test_moves_total"].value == 3.0
    assert samples["fgpu_test_moves_total"].labels == {"reason": "room"}


def test_a_post_is_refused_with_405(server: MetricsServer) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=5)
    assert raised.value.code == 405


def test_one_address_holds_at_most_its_share_of_connections(server: MetricsServer) -> None:
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(METRICS_LIMITS.max_connections_per_peer)]
    try:
        for s in held:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with extra:
            try:
                extra.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                got = extra.recv(1024)
            except ConnectionResetError:  # closed before our request was read: a reset, not a FIN
                got = b""
            assert got == b"", "one connection past the per-address bound is closed unanswered"
    finally:
        for s in held:
            s.close()
