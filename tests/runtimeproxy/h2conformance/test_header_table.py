"""The HPACK tables both peers share through the proxy stay in step whatever the proxy does with a call."""

from __future__ import annotations

import h2.events

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess

#: an answer's first headers, sent before the request's message arrived; x-early enters the runtime's table
EARLY = [*g.RESPONSE_HEADERS, (b"x-early", b"sent before the message")]


def test_a_header_block_the_runtime_sends_for_a_refused_call_keeps_kubelets_table_in_step(
    proxy: ProxyProcess, gate: Gate
) -> None:
    """Issue 14 defect 2: the relay before #14 decoded and dropped the runtime's header block for a call it had
    refused, so kubelet's table missed the entries the block added (the next answer: "Invalid table index")."""
    gate.reject = "refused while the runtime answered"
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    g.roundtrip(pair)
    sid = g.request(client, g.CREATE_CONTAINER, g.create_request())
    gate.wait_entered(pair)
    pair.pump(lambda: runtime.of(h2.events.RequestReceived, sid), what="the request headers at the runtime")
    runtime.conn.send_headers(sid, EARLY)  # queued; written once the proxy has refused the call
    gate.open()
    pair.pump(lambda: client.ended(sid), what="the proxy's refusal at kubelet")
    assert g.await_answer(pair, sid).status == 9
    runtime.flush()  # the runtime had not read the proxy's RST_STREAM yet
    assert pair.barrier()
    assert runtime.reset(sid) is not None
    # the next answers reuse the runtime's table, x-early's entry included
    for _ in range(2):
        g.roundtrip(pair)
    assert client.error is None
    gate.reject = ""
    checks.connection_works(pair)


def test_early_answer_headers_of_an_intercepted_call_reach_kubelet(proxy: ProxyProcess, gate: Gate) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    sid = checks.held_create(pair, gate)
    runtime.conn.send_headers(sid, EARLY)
    runtime.flush()
    pair.pump(lambda: client.of(h2.events.ResponseReceived, sid), what="the early headers at kubelet")
    assert client.headers(sid) == [EARLY]
    gate.open()
    assert checks.voided(g.await_request(pair, sid).message)
    g.send_body(runtime, sid, g.grpc_frame(g.CREATE_RESPONSE), end=False)
    runtime.conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
    runtime.flush()
    ans = g.await_answer(pair, sid)
    assert (ans.headers, ans.message) == (EARLY, g.CREATE_RESPONSE)
    checks.connection_works(pair)


def test_the_proxys_own_refusals_leave_both_tables_in_step(proxy: ProxyProcess, gate: Gate) -> None:
    gate.reject = "no"
    gate.open()
    pair = proxy.connect()
    for _ in range(3):
        g.roundtrip(pair)
        sid = g.request(pair.client, g.CREATE_CONTAINER, g.create_request())
        assert g.await_answer(pair, sid).status == 9
    gate.reject = ""
    checks.connection_works(pair)
