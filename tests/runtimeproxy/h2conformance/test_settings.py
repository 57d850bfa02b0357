"""SETTINGS changed by either peer in the middle of held (intercepted) and unheld (pass-through) calls."""

from __future__ import annotations

import h2.events
import h2.settings
import pytest

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import DEFAULT_WINDOW, Credit, pump, settings_acked, settle
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess

S = h2.settings.SettingCodes
MIB = 1 << 20


def test_a_window_the_runtime_raises_mid_call_applies_to_the_open_pass_through_stream(proxy: ProxyProcess) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    sid = g.request(client, g.UNKNOWN, b"", end=False)
    g.send_body(client, sid, b"a" * 1000, end=False)
    client.flush()
    runtime.conn.update_settings({S.INITIAL_WINDOW_SIZE: MIB, S.MAX_FRAME_SIZE: 65536})
    runtime.conn.increment_flow_control_window(4 * MIB)
    runtime.flush()
    pair.pump(settings_acked(runtime, 2), what="kubelet's ACK at the runtime")
    changed = client.of(h2.events.RemoteSettingsChanged)[-1].changed_settings
    assert changed[S.INITIAL_WINDOW_SIZE].new_value == MIB
    assert changed[S.MAX_FRAME_SIZE].new_value == 65536
    # RFC 9113 6.9.2: the open stream's window moved by the difference, on both ends
    assert pair.barrier()
    assert client.conn.local_flow_control_window(sid) == runtime.conn.streams[sid].inbound_flow_control_window == MIB
    body = bytes(range(256)) * 2400  # 600 KiB in one burst, in 64 KiB frames, no waiting for credit
    g.send_body(client, sid, body, end=True)
    client.flush()
    pair.pump(lambda: g.request_done(runtime, sid), what="the burst at the runtime")
    assert runtime.error is None
    assert runtime.body(sid) == b"a" * 1000 + body
    assert max(len(f.payload) for f in runtime.frames_of(0, sid)) == 65536
    g.respond(runtime, sid, b"ok")
    assert g.await_answer(pair, sid).message == b"ok"
    checks.connection_works(pair)


@pytest.mark.parametrize("lowered", [False, True], ids=["raised", "lowered"])
def test_kubelets_window_changed_mid_call_governs_the_runtimes_answer(proxy: ProxyProcess, gate: Gate, lowered: bool) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    held = checks.held_create(pair, gate)
    unheld = g.request(client, g.UNKNOWN, b"x")
    g.await_request(pair, unheld)
    window = 1024 if lowered else 4 * MIB
    client.conn.update_settings({S.INITIAL_WINDOW_SIZE: window})
    client.flush()
    pair.pump(settings_acked(client, 2), what="the runtime's ACK at kubelet")
    assert runtime.of(h2.events.RemoteSettingsChanged)[-1].changed_settings[S.INITIAL_WINDOW_SIZE].new_value == window
    gate.open()
    g.await_request(pair, held)
    answer = b"z" * 50_000
    for sid in (held, unheld):
        runtime.conn.send_headers(sid, g.RESPONSE_HEADERS)
        g.send_all(pair, runtime, sid, g.grpc_frame(answer), end=False)
        runtime.conn.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
        runtime.flush()
    for sid in (held, unheld):
        assert g.await_answer(pair, sid).message == answer
    assert client.error is None and runtime.error is None
    checks.connection_works(pair)


@pytest.mark.parametrize("kubelet_acks_first", [True, False], ids=["acked-before-the-hook-answers", "acked-after"])
def test_a_window_the_runtime_raises_while_a_call_is_held_lets_the_held_request_through(
    proxy: ProxyProcess, gate: Gate, kubelet_acks_first: bool
) -> None:
    """Issue 14 defect 1: the relay before #14 applied only decreases of the runtime's INITIAL_WINDOW_SIZE to held
    streams, so the held request stalled at the old window."""
    # The runtime raises its stream window to 1 MiB and grants the connection 4 MiB, as grpc-go's BDP
    # estimator does, and returns no stream credit by itself: the new window is all the proxy may use.
    # After kubelet's ACK the runtime holds the proxy to the new window (RFC 9113 6.9.2), before it to
    # the old one: DATA sent under the new window ahead of the forwarded ACK is a FLOW_CONTROL_ERROR.
    pair = proxy.connect(runtime_credit=Credit.NONE)
    runtime = pair.runtime
    sid = checks.held_create(pair, gate, env_bytes=200_000)
    runtime.conn.update_settings({S.INITIAL_WINDOW_SIZE: MIB})
    runtime.conn.increment_flow_control_window(4 * MIB)
    runtime.flush()
    if kubelet_acks_first:
        pair.pump(settings_acked(runtime, 2), what="kubelet's ACK at the runtime")
        gate.open()
    else:
        # the old window's worth goes out first, and kubelet's ACK reaches the proxy while the rest waits
        gate.open()
        pump([runtime], lambda: len(runtime.body(sid)) >= DEFAULT_WINDOW or runtime.dead, what="the old window's worth")
        settle([runtime], 0.1)
        assert len(runtime.body(sid)) == DEFAULT_WINDOW
        assert len(runtime.of(h2.events.SettingsAcknowledged)) == 1  # kubelet has not acknowledged the change
    got = g.await_request(pair, sid, timeout=1.5)
    assert runtime.error is None, runtime.error
    assert checks.voided(got.message)
    g.respond(runtime, sid, g.CREATE_RESPONSE)
    assert g.await_answer(pair, sid).message == g.CREATE_RESPONSE


def test_a_window_the_runtime_lowers_while_a_call_is_held_is_respected(proxy: ProxyProcess, gate: Gate) -> None:
    pair = proxy.connect(runtime_credit=Credit.LAZY)
    runtime = pair.runtime
    sid = checks.held_create(pair, gate, env_bytes=100_000)
    runtime.conn.update_settings({S.INITIAL_WINDOW_SIZE: 16384})
    runtime.flush()
    pair.pump(settings_acked(runtime, 2), what="kubelet's ACK at the runtime")
    gate.open()
    got = g.await_request(pair, sid)
    assert runtime.error is None, runtime.error  # h2 raises FlowControlError on DATA past its window
    assert max(len(f.payload) for f in runtime.frames_of(0, sid)) <= 16384
    assert checks.voided(got.message)
    g.respond(runtime, sid, g.CREATE_RESPONSE)
    assert g.await_answer(pair, sid).message == g.CREATE_RESPONSE
    checks.connection_works(pair)


@pytest.mark.parametrize("held", [False, True], ids=["unheld", "held"])
def test_header_table_sizes_changed_both_ways_mid_call_keep_hpack_in_step(
    proxy: ProxyProcess, gate: Gate, held: bool
) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    for _ in range(3):  # fill both dynamic tables
        g.roundtrip(pair)
    sid = checks.held_create(pair, gate) if held else g.request(client, g.UNKNOWN, b"x")
    if not held:
        g.await_request(pair, sid)
    runtime.conn.update_settings({S.HEADER_TABLE_SIZE: 256})
    client.conn.update_settings({S.HEADER_TABLE_SIZE: 0})
    runtime.flush()
    client.flush()
    pair.pump(lambda: settings_acked(runtime, 2)() and settings_acked(client, 2)(), what="both ACKs")
    gate.open()
    got = g.await_request(pair, sid)
    g.respond(runtime, sid, g.CREATE_RESPONSE if held else b"x")
    assert g.await_answer(pair, sid).message == (g.CREATE_RESPONSE if held else b"x")
    if held:
        assert checks.voided(got.message)
    for _ in range(3):
        g.roundtrip(pair)
    # and back up: each encoder signals the new size in its next block
    runtime.conn.update_settings({S.HEADER_TABLE_SIZE: 8192})
    client.conn.update_settings({S.HEADER_TABLE_SIZE: 8192})
    runtime.flush()
    client.flush()
    pair.pump(lambda: settings_acked(runtime, 3)() and settings_acked(client, 3)(), what="both ACKs")
    checks.connection_works(pair)
    checks.connection_works(pair)
