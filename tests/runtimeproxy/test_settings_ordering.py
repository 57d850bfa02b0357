"""Issue 14, defect 1: the runtime's SETTINGS reach the relay's own sends only after kubelet's ACK went on,
and a changed SETTINGS_INITIAL_WINDOW_SIZE moves a held call's window by the difference, up or down."""

from __future__ import annotations

import time

import h2.events
import h2.settings

from apis import names
from tests.runtimeproxy.h2peers import (
    ACK,
    CREATE_CONTAINER,
    DATA,
    SETTINGS,
    Credit,
    Peer,
    connect_pair,
    create_container_request,
    env_of,
    grpc_frame,
    proxy_before_h2_runtime,
    pump,
    request,
    respond,
    send_body,
)

S = h2.settings.SettingCodes
#: about 220 KB of request: several times the runtime's default stream window
BIG_ENVS = {f"VAR_{i}": "x" * 100 for i in range(2000)}
DEFAULT_WINDOW = 65535


def _data_before_last_ack(runtime: Peer, sid: int) -> int:
    """Bytes of DATA on `sid` that reached the runtime before the last SETTINGS ACK did."""
    last_ack = max(i for i, f in enumerate(runtime.frames) if f.ftype == SETTINGS and f.flags & ACK)
    return sum(len(f.payload) for f in runtime.frames[:last_ack] if f.ftype == DATA and f.stream_id == sid)


def _held_request_arrives_edited(kubelet: Peer, runtime: Peer, sid: int) -> None:
    message = runtime.body(sid)[5:]
    env = env_of(message)
    assert env[names.NVIDIA_VISIBLE_DEVICES] == b"void"
    assert len(env) == len(BIG_ENVS) + 1
    respond(runtime, sid, b"\x0a\x04fake")
    pump([kubelet, runtime], lambda: kubelet.ended(sid), what="the answer at kubelet")
    assert kubelet.body(sid)[5:] == b"\x0a\x04fake"
    assert kubelet.error is None and runtime.error is None


def test_a_window_the_runtime_raises_lets_a_stalled_held_request_through_after_kubelets_ack() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        # the runtime returns connection credit only: the held call's stream window moves by SETTINGS alone
        rt.credit = Credit.CONNECTION
        rt.conn.increment_flow_control_window(8 << 20)
        rt.flush()
        sid = request(kubelet, CREATE_CONTAINER, grpc_frame(create_container_request(envs=BIG_ENVS)))
        pump([kubelet, rt], lambda: len(rt.body(sid)) >= DEFAULT_WINDOW, what="the held request's first window")
        stalled_until = time.monotonic() + 0.3
        pump([kubelet, rt], lambda: time.monotonic() > stalled_until)
        assert len(rt.body(sid)) == DEFAULT_WINDOW  # the relay keeps to the window it has

        rt.conn.update_settings({S.INITIAL_WINDOW_SIZE: 1 << 20})
        rt.flush()
        pump([kubelet, rt], lambda: rt.ended(sid), what="the rest of the held request, under the raised window")

        # h2 at the runtime counts the new window only from kubelet's ACK on: nothing came early
        assert rt.error is None, rt.error
        assert _data_before_last_ack(rt, sid) <= DEFAULT_WINDOW
        _held_request_arrives_edited(kubelet, rt, sid)


def test_a_window_the_runtime_lowers_shrinks_a_held_calls_window_by_the_difference() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        sid = request(kubelet, CREATE_CONTAINER, None, end=False)
        pump([kubelet, rt], lambda: rt.of(h2.events.RequestReceived, sid), what="the held call's headers")
        rt.conn.update_settings({S.INITIAL_WINDOW_SIZE: 1000})
        rt.flush()
        pump([kubelet, rt], lambda: len(rt.of(h2.events.SettingsAcknowledged)) == 2, what="kubelet's ACK")

        send_body([kubelet, rt], kubelet, sid, grpc_frame(create_container_request(envs=BIG_ENVS)))
        pump([kubelet, rt], lambda: rt.ended(sid), timeout=10, what="the held request in 1000-byte windows")

        # an over-sent byte would be a FLOW_CONTROL_ERROR at the runtime
        assert rt.error is None, rt.error
        assert max(len(f.payload) for f in rt.frames_of(DATA, sid)) <= 1000
        _held_request_arrives_edited(kubelet, rt, sid)
