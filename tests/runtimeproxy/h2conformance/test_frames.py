"""Frames grpcio never sends, across pass-through and intercepted calls: CONTINUATION, padding, PRIORITY, PING."""

from __future__ import annotations

import h2.events
import pytest

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import (
    CONTINUATION,
    DATA,
    HEADERS,
    PADDED,
    PRIORITY,
    PRIORITY_FLAG,
    RawFrame,
    frame,
    pad_headers,
    split_headers,
)
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess

CALLS = {"pass-through": (g.UNKNOWN, b"echo me", b"echoed"), "intercepted": (g.CREATE_CONTAINER, None, g.CREATE_RESPONSE)}


def _message(kind: str) -> tuple[str, bytes, bytes]:
    path, message, answer = CALLS[kind]
    return path, message if message is not None else g.create_request(), answer


def _check_request(kind: str, got: g.Request, sent: bytes) -> None:
    if kind == "intercepted":
        assert checks.voided(got.message)
    else:
        assert got.message == sent


@pytest.mark.parametrize("kind", CALLS)
@pytest.mark.parametrize("how", ["big-block", "split-small-block"])
def test_header_blocks_in_continuation_frames_arrive_whole_both_ways(proxy: ProxyProcess, kind: str, how: str) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    path, message, answer = _message(kind)
    # 24 KiB of metadata does not fit one 16 KiB frame, so h2 itself continues the block
    big = ((b"x-big", bytes(i % 26 + 97 for i in range(24_000))),) if how == "big-block" else ()
    sid = client.conn.get_next_available_stream_id()
    headers = g.request_headers(path, extra=big)
    client.conn.send_headers(sid, headers)
    g.send_body(client, sid, g.grpc_frame(message))
    client.flush(split_headers(4) if how == "split-small-block" else None)
    got = g.await_request(pair, sid)
    assert got.headers == headers
    _check_request(kind, got, message)
    kinds = [f.type for f in runtime.frames if f.stream_id == sid and f.type in (HEADERS, CONTINUATION)]
    assert kinds[0] == HEADERS and CONTINUATION in kinds  # forwarded as the frames they came in
    response_headers = [*g.RESPONSE_HEADERS, *big, (b"x-answer", b"continued")]
    runtime.conn.send_headers(sid, response_headers)
    g.send_body(runtime, sid, g.grpc_frame(answer), end=False)
    runtime.conn.send_headers(sid, [(b"grpc-status", b"0"), (b"x-trailer", b"t" * 100)], end_stream=True)
    runtime.flush(split_headers(3))
    ans = g.await_answer(pair, sid)
    assert ans.headers == response_headers
    assert ans.message == answer
    assert ans.trailers == [(b"grpc-status", b"0"), (b"x-trailer", b"t" * 100)]
    assert CONTINUATION in [f.type for f in client.frames if f.stream_id == sid]
    checks.connection_works(pair)


@pytest.mark.parametrize("kind", CALLS)
def test_padded_data_and_headers_arrive_unpadded_and_count_against_the_windows(proxy: ProxyProcess, kind: str) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    path, message, answer = _message(kind)
    sid = client.conn.get_next_available_stream_id()
    headers = g.request_headers(path)
    client.conn.send_headers(sid, headers)
    g.send_body(client, sid, g.grpc_frame(message)[:7], end=False, pad=200)
    g.send_body(client, sid, g.grpc_frame(message)[7:], end=True, pad=255)
    client.flush(pad_headers(100))
    got = g.await_request(pair, sid)
    assert got.headers == headers
    _check_request(kind, got, message)
    if kind == "pass-through":
        assert all(f.flags & PADDED for f in runtime.frames if f.stream_id == sid and f.type in (HEADERS, DATA))
    runtime.conn.send_headers(sid, g.RESPONSE_HEADERS)
    g.send_body(runtime, sid, g.grpc_frame(answer), end=False, pad=77)
    runtime.conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
    runtime.flush(pad_headers(33))
    ans = g.await_answer(pair, sid)
    assert (ans.headers, ans.message, ans.trailers) == (g.RESPONSE_HEADERS, answer, [(b"grpc-status", b"0")])
    assert all(f.flags & PADDED for f in client.frames if f.stream_id == sid and f.type in (HEADERS, DATA))
    checks.connection_works(pair)  # includes: both windows agree, padding counted on both sides


@pytest.mark.parametrize("kind", CALLS)
def test_headers_with_a_priority_block_are_read_past_it(proxy: ProxyProcess, kind: str) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    path, message, answer = _message(kind)
    sid = client.conn.get_next_available_stream_id()
    headers = g.request_headers(path)
    client.conn.send_headers(sid, headers)
    g.send_body(client, sid, g.grpc_frame(message))
    client.flush(pad_headers(9, priority=True))
    got = g.await_request(pair, sid)
    assert got.headers == headers
    _check_request(kind, got, message)  # the proxy read :path past the priority block: intercepted is edited
    priority = runtime.of(h2.events.PriorityUpdated, sid)
    assert priority and priority[0].weight == 201  # hyperframe's wire weight 200 is 201
    assert runtime.frames_of(HEADERS, sid)[0].flags & PRIORITY_FLAG
    g.respond(runtime, sid, answer)
    assert g.await_answer(pair, sid).message == answer
    checks.connection_works(pair)


def test_priority_frames_reach_the_runtime_for_open_held_and_idle_streams(proxy: ProxyProcess, gate: Gate) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    held = checks.held_create(pair, gate)
    unheld = g.request(client, g.UNKNOWN, b"x", end=False)
    idle = unheld + 2
    for sid, depends_on in ((held, 0), (unheld, held), (idle, unheld)):
        client.conn.prioritize(sid, weight=32, depends_on=depends_on)
    client.flush()
    assert pair.barrier()
    updated = {e.stream_id: (e.weight, e.depends_on) for e in runtime.of(h2.events.PriorityUpdated)}
    assert updated == {held: (32, 0), unheld: (32, held), idle: (32, unheld)}
    assert [f.stream_id for f in runtime.frames_of(PRIORITY)] == [held, unheld, idle]
    gate.open()
    assert checks.voided(g.await_request(pair, held).message)
    g.respond(runtime, held, g.CREATE_RESPONSE)
    g.send_body(client, unheld, g.grpc_frame(b"x"))
    client.flush()
    assert g.await_request(pair, unheld).message == b"x"
    g.respond(runtime, unheld, b"y")
    assert g.await_answer(pair, held).message == g.CREATE_RESPONSE
    assert g.await_answer(pair, unheld).message == b"y"
    checks.connection_works(pair)


@pytest.mark.parametrize("held", [False, True], ids=["idle", "during-a-held-call"])
def test_pings_from_either_side_are_answered_by_the_other_peer(proxy: ProxyProcess, gate: Gate, held: bool) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    sid = checks.held_create(pair, gate) if held else None
    if not held:
        gate.open()
    client.conn.ping(b"kubelet!")
    runtime.conn.ping(b"runtime!")
    client.flush()
    runtime.flush()
    pair.pump(lambda: client.of(h2.events.PingAckReceived) and runtime.of(h2.events.PingAckReceived), what="both ACKs")
    assert [e.ping_data for e in runtime.of(h2.events.PingReceived)] == [b"kubelet!"]
    assert [e.ping_data for e in client.of(h2.events.PingReceived)] == [b"runtime!"]
    assert [e.ping_data for e in client.of(h2.events.PingAckReceived)] == [b"kubelet!"]
    assert [e.ping_data for e in runtime.of(h2.events.PingAckReceived)] == [b"runtime!"]
    if sid is not None:
        gate.open()
        assert checks.voided(g.await_request(pair, sid).message)
        g.respond(runtime, sid, g.CREATE_RESPONSE)
        assert g.await_answer(pair, sid).message == g.CREATE_RESPONSE
    checks.connection_works(pair)


def test_unknown_frame_types_pass_both_ways_and_change_nothing(proxy: ProxyProcess) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    client.send_raw(frame(0xFA, 0x0, 0, b"from kubelet"))
    runtime.send_raw(frame(0xFB, 0x3, 1, b"from runtime"))
    assert pair.barrier()
    unknown = [f for f in runtime.frames if f.type == 0xFA]
    assert unknown in ([RawFrame(0xFA, 0, 0, b"from kubelet")], [])  # RFC 9113 5.5: an intermediary may drop them
    checks.connection_works(pair)
