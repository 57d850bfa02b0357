"""GOAWAY from the runtime (containerd stopping or restarting) while calls are in flight.

The runtime's GOAWAY is written as a raw frame: h2 closes its whole
connection on sending one, and a runtime that goes away gracefully still
answers the streams up to its last stream id.
"""

from __future__ import annotations

import h2.events

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import GOAWAY, NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, frame
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess

UNAVAILABLE = 14


def goaway(last_stream_id: int, code: int = NO_ERROR, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


def test_calls_in_flight_finish_after_the_runtimes_goaway(proxy: ProxyProcess, gate: Gate) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    held = checks.held_create(pair, gate)
    unheld = g.request(client, g.UNKNOWN, b"in flight")
    g.await_request(pair, unheld)
    runtime.send_raw(goaway(unheld, NO_ERROR, b"shutting down"))
    pair.pump(lambda: client.goaways, what="the GOAWAY at kubelet")
    first = client.goaways[0]
    assert (first.last_stream_id, first.error_code, first.payload[8:]) == (unheld, NO_ERROR, b"shutting down")
    # both calls the runtime took are still answered: the pass-through one, and the held one once the hook answers
    g.respond(runtime, unheld, b"answered")
    assert g.await_answer(pair, unheld).message == b"answered"
    gate.open()
    assert checks.voided(g.await_request(pair, held).message)
    g.respond(runtime, held, g.CREATE_RESPONSE)
    assert g.await_answer(pair, held).message == g.CREATE_RESPONSE
    assert client.error is None and runtime.error is None
    runtime.close()
    pair.pump(lambda: client.eof, what="kubelet's connection to close")
    assert all(f.last_stream_id <= unheld for f in client.goaways), client.goaways
    checks.others_work(proxy)


def test_streams_above_the_runtimes_last_stream_id_are_never_reported_as_processed(
    proxy: ProxyProcess, gate: Gate
) -> None:
    """Found by this test (not among issue 14's six defects; passes since #14's relay work): when the runtime
    closed after its GOAWAY, the relay sent kubelet a second GOAWAY with a higher last stream id (RFC 9113 6.8:
    it must not increase), naming streams the runtime never took."""
    gate.open()
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    taken = g.request(client, g.UNKNOWN, b"taken")
    g.await_request(pair, taken)
    runtime.send_raw(goaway(taken))
    # kubelet opens two more streams before the GOAWAY reaches it
    late_pass = g.request(client, g.UNKNOWN, b"late")
    late_create = g.request(client, g.CREATE_CONTAINER, g.create_request())
    pair.pump(lambda: client.goaways and runtime.of(h2.events.RequestReceived, late_pass), what="the GOAWAY and the late stream")
    g.respond(runtime, taken, b"answered")
    assert g.await_answer(pair, taken).message == b"answered"
    pair.settle(0.2)
    runtime.close()  # the runtime ignores streams above its last stream id, then goes
    pair.pump(lambda: client.eof, what="kubelet's connection to close")
    for sid in (late_pass, late_create):
        ok = client.of(h2.events.StreamEnded, sid) and dict(client.headers(sid)[-1]).get(b"grpc-status") == b"0"
        assert not ok, f"stream {sid} above the last stream id was answered OK"
        reset = client.reset(sid)
        assert reset is None or reset.error_code == REFUSED_STREAM
    assert [f.last_stream_id for f in client.goaways if f.last_stream_id > taken] == [], client.goaways


def test_a_goaway_with_an_error_ends_the_calls_the_runtime_did_not_answer(proxy: ProxyProcess, gate: Gate) -> None:
    gate.open()
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    sid = g.request(client, g.UNKNOWN, b"cut short")
    g.await_request(pair, sid)
    runtime.send_raw(goaway(sid, PROTOCOL_ERROR, b"bad peer"))
    runtime.close()
    pair.pump(lambda: client.ended(sid) and client.eof, what="the call's end and the connection's")
    assert client.goaways[0].error_code == PROTOCOL_ERROR
    ans = client.headers(sid)
    reset = client.reset(sid)
    assert reset is not None or dict(ans[-1]).get(b"grpc-status") == str(UNAVAILABLE).encode(), (ans, reset)
    checks.others_work(proxy)
