"""RST_STREAM from kubelet or from the runtime at every stage of an intercepted CreateContainer.

The stages: headers sent, part of the message sent, the whole message held
while the hook has it, the edited message at the runtime, the answer's headers
sent. After each reset the other peer has the reset with its code, the runtime
gets nothing more on that stream, and the connection carries new calls with
both windows in agreement.
"""

from __future__ import annotations

import h2.errors
import h2.events
import pytest

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import DATA, DEFAULT_WINDOW, RST_STREAM, Credit, Pair
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess

STAGES = ["headers", "part-of-the-message", "held-by-the-hook", "at-the-runtime", "answer-headers-sent"]
ENV_BYTES = 30_000  # the message spans a few frames


def _to_stage(pair: Pair, gate: Gate, stage: str) -> int:
    client, runtime = pair.client, pair.runtime
    body = g.grpc_frame(g.create_request(env_bytes=ENV_BYTES))
    sid = g.request(client, g.CREATE_CONTAINER, b"", end=False)
    pair.pump(lambda: runtime.of(h2.events.RequestReceived, sid), what="the request headers at the runtime")
    if stage == "headers":
        return sid
    if stage == "part-of-the-message":
        g.send_body(client, sid, body[:20_000], end=False)
        client.flush()
        assert pair.barrier()
        return sid
    g.send_all(pair, client, sid, body)
    gate.wait_entered(pair)
    if stage == "held-by-the-hook":
        return sid
    gate.open()
    got = g.await_request(pair, sid)
    assert checks.voided(got.message)
    if stage == "answer-headers-sent":
        runtime.conn.send_headers(sid, g.RESPONSE_HEADERS)
        runtime.flush()
        pair.pump(lambda: client.of(h2.events.ResponseReceived, sid), what="the answer headers at kubelet")
    return sid


def _after_the_reset(pair: Pair, gate: Gate, sid: int, runtime_frames_before: int) -> None:
    gate.open()  # a call the hook still had: its answer must not reach the runtime now
    pair.settle(0.1)
    assert pair.barrier()
    later = [f for f in pair.runtime.frames[runtime_frames_before:] if f.stream_id == sid]
    assert [f for f in later if f.type == DATA] == [], "the runtime got DATA for a stream already reset"
    assert pair.client.error is None and pair.runtime.error is None
    checks.connection_works(pair)


@pytest.mark.parametrize("stage", STAGES)
def test_kubelets_reset_reaches_the_runtime_at_every_stage(proxy: ProxyProcess, gate: Gate, stage: str) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    sid = _to_stage(pair, gate, stage)
    mark = len(runtime.frames)
    client.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
    client.flush()
    pair.pump(lambda: runtime.reset(sid), what="the reset at the runtime")
    reset = runtime.reset(sid)
    assert reset is not None and reset.error_code == h2.errors.ErrorCodes.CANCEL
    assert [f.type for f in runtime.frames[mark:] if f.stream_id == sid] == [RST_STREAM]
    _after_the_reset(pair, gate, sid, len(runtime.frames))


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("code", [h2.errors.ErrorCodes.CANCEL, h2.errors.ErrorCodes.REFUSED_STREAM,
                                  h2.errors.ErrorCodes.INTERNAL_ERROR])
def test_the_runtimes_reset_reaches_kubelet_at_every_stage(proxy: ProxyProcess, gate: Gate, stage: str,
                                                         code: h2.errors.ErrorCodes) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    sid = _to_stage(pair, gate, stage)
    mark = len(runtime.frames)
    runtime.conn.reset_stream(sid, code)
    runtime.flush()
    pair.pump(lambda: client.reset(sid), what="the reset at kubelet")
    reset = client.reset(sid)
    assert reset is not None and reset.error_code == code
    assert [f.type for f in client.frames if f.stream_id == sid][-1] == RST_STREAM
    _after_the_reset(pair, gate, sid, mark)


def test_the_runtimes_reset_while_it_still_takes_the_edited_message_settles_the_windows(
    proxy: ProxyProcess, gate: Gate
) -> None:
    # the runtime returns no credit: the proxy sends one window's worth of the edited message and waits
    pair = proxy.connect(runtime_credit=Credit.NONE)
    client, runtime = pair.client, pair.runtime
    sid = checks.held_create(pair, gate, env_bytes=200_000)
    gate.open()
    pair.pump(lambda: len(runtime.body(sid)) >= DEFAULT_WINDOW, what="a window's worth at the runtime")
    pair.settle(0.1)
    assert len(runtime.body(sid)) == DEFAULT_WINDOW
    runtime.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
    runtime.flush()
    pair.pump(lambda: client.reset(sid), what="the reset at kubelet")
    # the runtime hands back what the proxy had used of the connection window; none of it is kubelet's
    runtime.settle_credit()
    assert runtime.of(h2.events.StreamReset, sid) == []
    checks.windows_agree(pair)
    # a second large held message still goes through in full
    sid2 = checks.held_create(pair, gate, env_bytes=200_000)
    got = g.await_request(pair, sid2)
    assert checks.voided(got.message)
    g.respond(runtime, sid2, g.CREATE_RESPONSE)
    assert g.await_answer(pair, sid2).message == g.CREATE_RESPONSE
    checks.connection_works(pair)


def test_a_refused_call_is_answered_by_the_proxy_and_reset_at_the_runtime(proxy: ProxyProcess, hook: object) -> None:
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    hook.behaviour.reject = "not on this node"  # type: ignore[attr-defined]
    sid = g.request(client, g.CREATE_CONTAINER, g.create_request())
    ans = g.await_answer(pair, sid)
    assert ans.status == 9 and "not on this node" in ans.details  # FAILED_PRECONDITION
    pair.pump(lambda: runtime.reset(sid), what="the proxy's reset at the runtime")
    assert runtime.reset(sid).error_code == h2.errors.ErrorCodes.CANCEL  # type: ignore[union-attr]
    assert runtime.body(sid) == b""
    hook.behaviour.reject = ""  # type: ignore[attr-defined]
    checks.connection_works(pair)
