"""WINDOW_UPDATE at its edges, the runtime's stream limit, and frames larger than the receiver allows.

A frame that breaks a rule only the receiver's state shows (an increment that
overflows a window, a frame over the receiver's size) may reach that receiver
through the relay and be answered by it: what both peers must see is the
sender getting the RFC's error and the connection ending on both sides. A
frame the relay takes in itself (held requests, its own answers) must meet
the same rules.
"""

from __future__ import annotations

import h2.events
import h2.exceptions
import h2.settings
import pytest

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import (
    DATA,
    DEFAULT_WINDOW,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_WINDOW,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    WINDOW_UPDATE,
    Credit,
    frame,
)
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess

S = h2.settings.SettingCodes


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


@pytest.mark.parametrize("on", ["connection", "pass-through-stream", "held-stream"])
@pytest.mark.parametrize("sender_side", ["kubelet", "runtime"])
def test_a_zero_window_increment_is_a_protocol_error_for_its_sender(
    proxy: ProxyProcess, gate: Gate, sender_side: str, on: str
) -> None:
    """runtime-held-stream, issue 14 defect 4: the relay before #14 took the runtime's WINDOW_UPDATEs for a held
    stream in itself and never checked them."""
    pair = proxy.connect()
    sender = pair.client if sender_side == "kubelet" else pair.runtime
    held = checks.held_create(pair, gate)
    unheld = g.request(pair.client, g.UNKNOWN, b"", end=False)
    pair.pump(lambda: pair.runtime.of(h2.events.RequestReceived, unheld), what="the pass-through call at the runtime")
    sid = {"connection": 0, "pass-through-stream": unheld, "held-stream": held}[on]
    sender.send_raw(window_update(sid, 0))
    # a stream error may also be answered as a connection error (RFC 9113 5.4.1)
    checks.error_reached(pair, sender, PROTOCOL_ERROR, stream_id=sid or None)
    gate.open()
    if not sender.goaways:
        checks.connection_works(pair)
    checks.others_work(proxy)


@pytest.mark.parametrize("sender_side", ["kubelet", "runtime"])
def test_windows_reach_the_largest_size_and_one_more_is_a_flow_control_error(
    proxy: ProxyProcess, sender_side: str
) -> None:
    pair = proxy.connect()
    grantor, grantee = (pair.client, pair.runtime) if sender_side == "kubelet" else (pair.runtime, pair.client)
    sid = g.request(pair.client, g.UNKNOWN, b"", end=False)
    pair.pump(lambda: pair.runtime.of(h2.events.RequestReceived, sid), what="the call at the runtime")
    # grant up to exactly 2^31-1, connection and stream: legal, and both peers agree on it
    grantor.conn.increment_flow_control_window(MAX_WINDOW - grantor.conn.inbound_flow_control_window)
    grantor.conn.increment_flow_control_window(MAX_WINDOW - grantor.conn.streams[sid].inbound_flow_control_window, sid)
    grantor.flush()
    assert pair.barrier()
    assert grantee.conn.outbound_flow_control_window == MAX_WINDOW
    assert grantee.conn.streams[sid].outbound_flow_control_window == MAX_WINDOW
    assert grantee.error is None
    checks.windows_agree(pair)
    g.roundtrip(pair)
    # the window is full again after that call's credit: one more byte of credit overflows it
    assert pair.barrier()
    top_up = MAX_WINDOW - grantor.conn.inbound_flow_control_window
    grantor.send_raw(window_update(0, top_up + 1))
    checks.error_reached(pair, grantor, FLOW_CONTROL_ERROR)
    checks.others_work(proxy)


def test_the_runtimes_stream_limit_reaches_kubelet_and_held_calls_count_against_it(proxy: ProxyProcess, gate: Gate) -> None:
    pair = proxy.connect(runtime_settings={S.MAX_CONCURRENT_STREAMS: 2})
    client, runtime = pair.client, pair.runtime
    assert client.conn.remote_settings.max_concurrent_streams == 2
    held = checks.held_create(pair, gate)
    unheld = g.request(client, g.UNKNOWN, b"x")
    g.await_request(pair, unheld)
    assert runtime.conn.open_inbound_streams == 2  # the held call's stream is open at the runtime too
    with pytest.raises(h2.exceptions.TooManyStreamsError):
        client.conn.send_headers(client.conn.get_next_available_stream_id(), g.request_headers(g.UNKNOWN))
    g.respond(runtime, unheld, b"y")
    assert g.await_answer(pair, unheld).message == b"y"
    third = g.request(client, g.UNKNOWN, b"z")  # a slot is free again
    g.await_request(pair, third)
    g.respond(runtime, third, b"z")
    assert g.await_answer(pair, third).message == b"z"
    gate.open()
    g.await_request(pair, held)
    g.respond(runtime, held, g.CREATE_RESPONSE)
    assert g.await_answer(pair, held).message == g.CREATE_RESPONSE
    checks.connection_works(pair)


def test_a_stream_over_the_runtimes_limit_is_refused_to_kubelet(proxy: ProxyProcess, gate: Gate) -> None:
    pair = proxy.connect(runtime_settings={S.MAX_CONCURRENT_STREAMS: 1})
    client = pair.client
    checks.held_create(pair, gate)
    # kubelet ignores the limit
    limits = client.conn.remote_settings
    limits[S.MAX_CONCURRENT_STREAMS] = 100
    limits.acknowledge()
    over = g.request(client, g.UNKNOWN, b"over the limit")
    pair.pump(lambda: client.reset(over) or client.goaways or client.eof, what="the refusal")
    reset = client.reset(over)
    assert (reset is not None and reset.error_code in (REFUSED_STREAM, PROTOCOL_ERROR)) or any(
        f.error_code == PROTOCOL_ERROR for f in client.goaways
    ), client.describe()
    gate.open()
    checks.others_work(proxy)


@pytest.mark.parametrize("what", ["data-pass-through", "data-held", "headers"])
def test_a_frame_over_the_runtimes_size_limit_is_a_frame_size_error_for_kubelet(
    proxy: ProxyProcess, gate: Gate, what: str
) -> None:
    """data-held, issue 14 defect 4: the relay before #14 took an oversized DATA frame of a held request in
    without a FRAME_SIZE_ERROR."""
    gate.open()
    pair = proxy.connect()
    client = pair.client
    # kubelet ignores the runtime's SETTINGS_MAX_FRAME_SIZE (16384) and sends one frame of 20000 bytes
    client.conn.max_outbound_frame_size = 32768
    if what == "headers":
        sid = g.request(client, g.UNKNOWN, b"x", headers=g.request_headers(g.UNKNOWN, extra=((b"x-big", b"v" * 20_000),)))
    else:
        path, message = (g.UNKNOWN, bytes(20_000)) if what == "data-pass-through" else (g.CREATE_CONTAINER, g.create_request(env_bytes=20_000))
        sid = g.request(client, path, message)
    client.conn.max_outbound_frame_size = 16384
    checks.error_reached(pair, client, FRAME_SIZE_ERROR, stream_id=sid if what != "headers" else None)
    if not client.goaways:
        checks.connection_works(pair)
    checks.others_work(proxy)


def test_a_frame_over_kubelets_size_limit_is_a_frame_size_error_for_the_runtime(proxy: ProxyProcess) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    sid = g.request(client, g.UNKNOWN, b"x")
    g.await_request(pair, sid)
    runtime.conn.send_headers(sid, g.RESPONSE_HEADERS)
    runtime.flush()
    runtime.send_raw(frame(DATA, 0, sid, g.grpc_frame(b"y" * 19_995)))
    checks.error_reached(pair, runtime, FRAME_SIZE_ERROR, stream_id=sid)
    checks.others_work(proxy)


def test_the_proxys_own_answer_fits_kubelets_frame_size(proxy: ProxyProcess, hook: object) -> None:
    """Issue 14 defect 4: the relay before #14 did not cap its own trailers to kubelet's frame size, so a hook's
    long refusal was a FRAME_SIZE_ERROR at kubelet."""
    hook.behaviour.reject = "no GPU for you: " + "x" * 40_000  # type: ignore[attr-defined]
    pair = proxy.connect()
    client = pair.client
    sid = g.request(client, g.CREATE_CONTAINER, g.create_request())
    pair.pump(lambda: client.ended(sid) or client.dead, what="the refusal")
    assert client.error is None, client.error
    assert max(len(f.payload) for f in client.frames) <= client.conn.local_settings.max_frame_size
    ans = g.await_answer(pair, sid)
    assert ans.status == 9 and ans.details.startswith("fgpu-runtime-proxy: hook server")
    assert all(f.type != RST_STREAM for f in client.frames)
    hook.behaviour.reject = ""  # type: ignore[attr-defined]
    checks.connection_works(pair)


@pytest.mark.parametrize("canceller", ["kubelet", "runtime"])
def test_a_held_request_reset_while_it_is_sent_gives_back_all_credit_held_for_it(
    proxy: ProxyProcess, gate: Gate, canceller: str
) -> None:
    pair = proxy.connect(runtime_credit=Credit.NONE)
    client, runtime = pair.client, pair.runtime
    runtime.conn.increment_flow_control_window(1 << 20)  # connection credit to spare, so only the stream waits
    runtime.flush()
    held = checks.held_create(pair, gate, env_bytes=200_000)
    gate.open()
    pair.pump(lambda: len(runtime.body(held)) >= DEFAULT_WINDOW, what="a stream window's worth of the held request")
    # meanwhile another call's DATA, and the runtime returns the connection credit for everything it got
    other = g.request(client, g.UNKNOWN, bytes(30_000))
    g.await_request(pair, other)
    runtime.return_connection_credit()
    assert pair.barrier()
    assert len(runtime.body(held)) == DEFAULT_WINDOW  # no stream credit: the rest of the held request waits
    (client if canceller == "kubelet" else runtime).conn.reset_stream(held, 0x8)
    (client if canceller == "kubelet" else runtime).flush()
    pair.pump(lambda: client.reset(held) or runtime.reset(held), what="the reset")
    checks.windows_agree(pair)  # nothing is in transit any more
