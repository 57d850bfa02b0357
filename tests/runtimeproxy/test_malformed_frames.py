"""Issue 14, defect 4: a malformed frame gets the RFC 9113 error, is not passed on, and harms no other connection.

Connection errors: GOAWAY with the code to the sender, the other side's
connection ended cleanly (kubelet's open calls with UNAVAILABLE), one log
line naming the peer. Stream errors: RST_STREAM on that stream only. The
proxy's own trailers fit any peer's frame size and metadata limits.
"""

from __future__ import annotations

import logging
import os

import grpc
import hpack
import pytest

from runtimeproxy import grpc_framing
from runtimeproxy import h2frames as rh2
from runtimeproxy.hpack_codec import encode_unindexed
from tests.runtimeproxy.fakeruntime import CREATE_CONTAINER, FakeRuntime
from tests.runtimeproxy.h2peers import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PRIORITY,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Peer,
    RawFrame,
    connect_pair,
    frame,
    grpc_frame,
    proxy_before_h2_runtime,
    pump,
    request,
    respond,
    status_of,
)
from tests.runtimeproxy.hookserver import TestHookServer, write_hook_config
from tests.runtimeproxy.kubelet import ContainerSpec, Pod, PodSpec
from tests.runtimeproxy.rig import ProxyRig

PROTOCOL_ERROR, FRAME_SIZE_ERROR, CANCEL, COMPRESSION_ERROR = 0x1, 0x6, 0x8, 0x9
BAD_BLOCK = b"\xfe\x01"  # an indexed field past the end of every table

#: name -> (the frame, given the open call's stream and the next free one; the error code)
FROM_KUBELET = {
    "window-update-3-bytes": (lambda sid, new: frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"), FRAME_SIZE_ERROR),
    "window-update-5-bytes": (lambda sid, new: frame(WINDOW_UPDATE, 0, sid, b"\x00\x00\x01\x00\x00"), FRAME_SIZE_ERROR),
    "rst-stream-3-bytes": (lambda sid, new: frame(RST_STREAM, 0, sid, b"\x00\x00\x08"), FRAME_SIZE_ERROR),
    "rst-stream-5-bytes": (lambda sid, new: frame(RST_STREAM, 0, sid, b"\x00\x00\x00\x08\x00"), FRAME_SIZE_ERROR),
    "ping-7-bytes": (lambda sid, new: frame(PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR),
    "settings-5-bytes": (lambda sid, new: frame(SETTINGS, 0, 0, b"\x00\x04\x00\x01\x00"), FRAME_SIZE_ERROR),
    "settings-ack-with-payload": (lambda sid, new: frame(SETTINGS, ACK, 0, b"\x00" * 6), FRAME_SIZE_ERROR),
    "data-padding-past-the-end": (lambda sid, new: frame(DATA, PADDED, sid, b"\x09abc"), PROTOCOL_ERROR),
    "undecodable-header-block": (lambda sid, new: frame(HEADERS, END_HEADERS, new, BAD_BLOCK), COMPRESSION_ERROR),
    "continuation-without-headers": (lambda sid, new: frame(CONTINUATION, END_HEADERS, sid, b"\x88"), PROTOCOL_ERROR),
    "data-over-the-frame-size": (lambda sid, new: frame(DATA, 0, sid, b"x" * 16385), FRAME_SIZE_ERROR),
    "push-promise": (lambda sid, new: frame(PUSH_PROMISE, END_HEADERS, sid, b"\x00\x00\x00\x02\x88"), PROTOCOL_ERROR),
}

FROM_RUNTIME = {
    "window-update-5-bytes": (lambda sid: frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x01\x00\x00"), FRAME_SIZE_ERROR),
    "rst-stream-3-bytes": (lambda sid: frame(RST_STREAM, 0, sid, b"\x00\x00\x08"), FRAME_SIZE_ERROR),
    "ping-9-bytes": (lambda sid: frame(PING, 0, 0, b"123456789"), FRAME_SIZE_ERROR),
    "goaway-7-bytes": (lambda sid: frame(GOAWAY, 0, 0, b"\x00" * 7), FRAME_SIZE_ERROR),
    "undecodable-header-block": (lambda sid: frame(HEADERS, END_HEADERS, sid, BAD_BLOCK), COMPRESSION_ERROR),
    "push-promise": (lambda sid: frame(PUSH_PROMISE, END_HEADERS, sid, b"\x00\x00\x00\x02\x88"), PROTOCOL_ERROR),
}


def _raw(data: bytes) -> RawFrame:
    return RawFrame(data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:])


def _roundtrip(kubelet: Peer, runtime: Peer, message: bytes) -> None:
    sid = request(kubelet, "/test.Echo/Unary", grpc_frame(message))
    pump([kubelet, runtime], lambda: runtime.ended(sid), what="a call at the runtime")
    respond(runtime, sid, message)
    pump([kubelet, runtime], lambda: kubelet.ended(sid), what="its answer at kubelet")
    assert kubelet.body(sid)[5:] == message


def _open_call(kubelet: Peer, runtime: Peer) -> int:
    sid = request(kubelet, "/test.Echo/Unary", grpc_frame(b"open"), end=False)
    pump([kubelet, runtime], lambda: runtime.body(sid), what="the open call at the runtime")
    return sid


@pytest.mark.parametrize("name", FROM_KUBELET)
def test_a_malformed_frame_from_kubelet_gets_goaway_with_its_error_and_spares_other_connections(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    build, code = FROM_KUBELET[name]
    with proxy_before_h2_runtime() as (rig, runtime):
        other_kubelet, other_rt = connect_pair(rig, runtime)
        kubelet, rt = connect_pair(rig, runtime)
        sid = _open_call(kubelet, rt)
        bad = build(sid, sid + 2)
        with caplog.at_level(logging.WARNING, logger="runtimeproxy"):
            kubelet.send_raw(bad)
            pump([kubelet, rt], lambda: kubelet.eof and rt.eof, what="both connections to end")
        assert kubelet.goaways[-1] == (sid, code)
        assert _raw(bad) not in rt.frames
        assert rt.error is None and rt.goaways == [(0, 0)]
        assert f"connection error from kubelet pid={os.getpid()}" in caplog.text
        _roundtrip(other_kubelet, other_rt, b"untouched")


@pytest.mark.parametrize("name", FROM_RUNTIME)
def test_a_malformed_frame_from_the_runtime_gets_goaway_and_kubelets_open_call_ends_unavailable(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    build, code = FROM_RUNTIME[name]
    with proxy_before_h2_runtime() as (rig, runtime):
        other_kubelet, other_rt = connect_pair(rig, runtime)
        kubelet, rt = connect_pair(rig, runtime)
        sid = _open_call(kubelet, rt)
        bad = build(sid)
        with caplog.at_level(logging.WARNING, logger="runtimeproxy"):
            rt.send_raw(bad)
            pump([kubelet, rt], lambda: kubelet.eof and rt.eof, what="both connections to end")
        assert rt.goaways[-1][1] == code
        assert _raw(bad) not in kubelet.frames
        status, message = status_of(kubelet, sid)
        assert status == grpc.StatusCode.UNAVAILABLE.value[0]
        assert "broke the HTTP/2 protocol" in message
        assert kubelet.error is None and kubelet.goaways == [(sid, 0)]
        assert f"connection error from runtime {runtime.address}" in caplog.text
        _roundtrip(other_kubelet, other_rt, b"untouched")


def test_a_priority_frame_of_the_wrong_length_resets_only_its_stream() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        sid = _open_call(kubelet, rt)
        kubelet.send_raw(frame(PRIORITY, 0, sid, b"\x00\x00\x00\x00"))
        pump([kubelet, rt], lambda: kubelet.resets(sid) and rt.ended(sid), what="the stream's reset on both sides")
        assert kubelet.resets(sid) == [FRAME_SIZE_ERROR]
        assert rt.resets(sid) == [CANCEL]
        assert not rt.frames_of(PRIORITY)
        _roundtrip(kubelet, rt, b"the connection goes on")
        assert kubelet.goaways == [] and kubelet.error is None


def test_a_header_block_longer_than_one_frame_goes_out_as_headers_and_continuations() -> None:
    fields = [(b"grpc-status", b"13"), (b"grpc-message", b"x" * 40_000)]
    out = rh2.header_frames(7, True, encode_unindexed(fields))
    frames, pos = [], 0
    while pos < len(out):
        length = int.from_bytes(out[pos : pos + 3], "big")
        frames.append(_raw(out[pos : pos + 9 + length]))
        pos += 9 + length
    assert [f.ftype for f in frames] == [HEADERS, CONTINUATION, CONTINUATION]
    assert all(len(f.payload) <= 16384 and f.stream_id == 7 for f in frames)
    assert [f.flags for f in frames] == [0x1, 0, END_HEADERS]  # END_STREAM on HEADERS, END_HEADERS on the last
    decoded = hpack.Decoder().decode(b"".join(f.payload for f in frames), raw=True)
    assert decoded == fields


def test_a_hooks_long_refusal_reaches_kubelet_cut_to_fit_its_metadata_limit(
    fake_rig: ProxyRig, fake_runtime: FakeRuntime, hook_server: TestHookServer
) -> None:
    hook_server.behaviour.reject = "the hook explains at length: " + "\u00e9" * 50_000
    write_hook_config(fake_rig.hook_dir, name="talkative", endpoint=hook_server.endpoint, stages=["PreCreateContainer"])
    fake_rig.start()
    with fake_rig.kubelet() as k:
        spec = PodSpec(name="p")
        pod = Pod(spec=spec, sandbox_id="sandbox-1", config=k.pod_config(spec), log_dir="/tmp")
        req = k.create_container_request(pod, ContainerSpec(name="c")).SerializeToString()
        with pytest.raises(grpc.RpcError) as err:
            k.raw(CREATE_CONTAINER, req)
        # grpc-core clients fail a call whose trailers pass 8 KiB: the proxy's own stay far below
        details = err.value.details() or ""
        assert err.value.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "the hook explains at length" in details
        assert details.endswith("(truncated)")
        assert len(grpc_framing.status_message(details)) <= grpc_framing.MAX_STATUS_MESSAGE
        assert k.raw("/test.Echo/Unary", b"next call")[0] == b"next call"
