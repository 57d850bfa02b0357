"""The proxy stopped with SIGTERM (a systemd restart) while calls are in flight."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import NO_ERROR
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess
from tests.runtimeproxy.hookserver import TestHookServer


@pytest.fixture
def own_proxy(hook: TestHookServer) -> Iterator[ProxyProcess]:
    proxy = ProxyProcess(tempfile.mkdtemp(prefix="fgpu-h2-stop-", dir="/tmp"), hook_endpoint=hook.endpoint).start()
    yield proxy
    proxy.close_all()
    proxy.stop()


def test_sigterm_sends_goaway_and_lets_the_calls_in_flight_finish(own_proxy: ProxyProcess, gate: Gate) -> None:
    """Issue 14 defect 3: the relay before #14 sent kubelet no GOAWAY on SIGTERM."""
    pair = own_proxy.connect()
    client, runtime = pair.client, pair.runtime
    held = checks.held_create(pair, gate)
    unheld = g.request(client, g.UNKNOWN, b"in flight")
    g.await_request(pair, unheld)
    own_proxy.terminate()
    pair.pump(lambda: client.goaways, timeout=1.0, what="the proxy's GOAWAY")
    g.respond(runtime, unheld, b"answered")
    assert g.await_answer(pair, unheld).message == b"answered"
    gate.open()
    assert checks.voided(g.await_request(pair, held).message)
    g.respond(runtime, held, g.CREATE_RESPONSE)
    assert g.await_answer(pair, held).message == g.CREATE_RESPONSE
    pair.pump(lambda: client.eof, what="the proxy to close kubelet's connection")
    # one GOAWAY naming the last stream, or RFC 9113 6.8's two (2^31-1 first, then the last stream)
    ids = [f.last_stream_id for f in client.goaways]
    assert ids[-1] == unheld and ids == sorted(ids, reverse=True), ids
    assert {f.error_code for f in client.goaways} == {NO_ERROR}
    assert own_proxy.proc is not None and own_proxy.proc.wait(5) == 0
