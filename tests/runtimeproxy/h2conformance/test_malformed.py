"""Every malformed frame length, from kubelet and from the runtime, and header blocks that do not decode.

RFC 9113: WINDOW_UPDATE, RST_STREAM, PING, SETTINGS (not a multiple of 6, or an
ACK with a payload) and GOAWAY of the wrong length are connection errors of
type FRAME_SIZE_ERROR; PRIORITY of the wrong length is a stream error of that
type; padding as long as the frame is a PROTOCOL_ERROR; a header block that
does not decode is a COMPRESSION_ERROR. The proxy reads these frames (or
relays them), so it answers them itself: the sender gets the error, the other
peer never receives the malformed frame, and its connection ends cleanly
(issue 14, defect 4: the relay before #14 passed every one of these on, or
read past its end, or closed without GOAWAY on a bad header block). Every
other connection is untouched.
"""

from __future__ import annotations

from collections.abc import Callable

import h2.events
import pytest

from tests.runtimeproxy.h2conformance import checks
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import (
    ACK,
    COMPRESSION_ERROR,
    DATA,
    END_HEADERS,
    END_STREAM,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PRIORITY,
    PROTOCOL_ERROR,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Pair,
    Peer,
    frame,
    split,
)
from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess

#: name -> (frame for the open stream `sid`, the error codes the RFC allows, a stream error?)
MALFORMED: dict[str, tuple[Callable[[int], bytes], tuple[int, ...], bool]] = {
    "window-update-connection-2-bytes": (lambda sid: frame(WINDOW_UPDATE, 0, 0, b"\x00\x01"), (FRAME_SIZE_ERROR,), False),
    "window-update-connection-6-bytes": (lambda sid: frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x01\x00\x00\x00"),
                                         (FRAME_SIZE_ERROR,), False),
    "window-update-stream-3-bytes": (lambda sid: frame(WINDOW_UPDATE, 0, sid, b"\x00\x00\x01"), (FRAME_SIZE_ERROR,), False),
    "rst-stream-3-bytes": (lambda sid: frame(RST_STREAM, 0, sid, b"\x00\x00\x08"), (FRAME_SIZE_ERROR,), False),
    "rst-stream-5-bytes": (lambda sid: frame(RST_STREAM, 0, sid, b"\x00\x00\x00\x08\x00"), (FRAME_SIZE_ERROR,), False),
    "ping-7-bytes": (lambda sid: frame(PING, 0, 0, b"1234567"), (FRAME_SIZE_ERROR,), False),
    "ping-9-bytes": (lambda sid: frame(PING, 0, 0, b"123456789"), (FRAME_SIZE_ERROR,), False),
    "settings-5-bytes": (lambda sid: frame(SETTINGS, 0, 0, b"\x00\x04\x00\x01\x00"), (FRAME_SIZE_ERROR,), False),
    "settings-ack-with-payload": (lambda sid: frame(SETTINGS, ACK, 0, b"\x00\x04\x00\x01\x00\x00"),
                                  (FRAME_SIZE_ERROR,), False),
    "goaway-7-bytes": (lambda sid: frame(GOAWAY, 0, 0, b"\x00\x00\x00\x00\x00\x00\x00"), (FRAME_SIZE_ERROR,), False),
    "priority-4-bytes": (lambda sid: frame(PRIORITY, 0, sid, b"\x00\x00\x00\x00"), (FRAME_SIZE_ERROR,), True),
    "priority-6-bytes": (lambda sid: frame(PRIORITY, 0, sid, b"\x00\x00\x00\x00\x10\x00"), (FRAME_SIZE_ERROR,), True),
    "data-padding-longer-than-frame": (lambda sid: frame(DATA, PADDED, sid, b"\x09abc"), (PROTOCOL_ERROR,), False),
    # no room even for the pad length: too short for its mandatory field, or padding past the end
    "headers-padded-without-payload": (lambda sid: frame(HEADERS, PADDED | END_HEADERS | END_STREAM, sid, b""),
                                       (PROTOCOL_ERROR, FRAME_SIZE_ERROR), False),
    # RFC 9113 6.2: padding that leaves less than nothing for the header block fragment
    "headers-padding-longer-than-frame": (lambda sid: frame(HEADERS, PADDED | END_HEADERS | END_STREAM, sid, b"\x03ab"),
                                          (PROTOCOL_ERROR,), False),
}


def _open_call(pair: Pair, gate: Gate, held: bool) -> int:
    if held:
        return checks.held_create(pair, gate)
    sid = g.request(pair.client, g.UNKNOWN, b"", end=False)
    pair.pump(lambda: pair.runtime.of(h2.events.RequestReceived, sid), what="the call at the runtime")
    return sid


@pytest.mark.parametrize("name", list(MALFORMED))
@pytest.mark.parametrize("sender_side", ["kubelet", "runtime"])
def test_a_malformed_frame_is_answered_with_its_error_and_not_passed_on(
    proxy: ProxyProcess, gate: Gate, sender_side: str, name: str
) -> None:
    build, codes, stream_error = MALFORMED[name]
    pair = proxy.connect()
    sender: Peer = pair.client if sender_side == "kubelet" else pair.runtime
    held = name.startswith("data-") and sender_side == "kubelet"  # padding the proxy must read: a held request's
    sid = _open_call(pair, gate, held)
    raw = build(sid)
    sender.send_raw(raw)
    checks.answered_by_the_proxy(pair, sender, split(raw)[0], codes, stream_error=stream_error)
    gate.open()
    if stream_error and not sender.goaways:
        other = pair.runtime if sender is pair.client else pair.client
        pair.pump(lambda: other.ended(sid), what="the other half of the stream reset")
        checks.connection_works(pair)
    checks.others_work(proxy)
    assert not proxy.problems(), proxy.problems()


@pytest.mark.parametrize("sender_side", ["kubelet", "runtime"])
def test_a_header_block_that_does_not_decode_is_a_compression_error_for_its_sender(
    proxy: ProxyProcess, gate: Gate, sender_side: str
) -> None:
    gate.open()
    pair = proxy.connect()
    client, runtime = pair.client, pair.runtime
    sid = g.request(client, g.UNKNOWN, b"x")
    g.await_request(pair, sid)
    bad_block = b"\xfe\x01"  # indexed field 254 + 128: no such table entry
    if sender_side == "kubelet":
        raw = frame(HEADERS, END_HEADERS, client.conn.get_next_available_stream_id(), bad_block)
        client.send_raw(raw)
        checks.answered_by_the_proxy(pair, client, split(raw)[0], (COMPRESSION_ERROR,))
    else:
        raw = frame(HEADERS, END_HEADERS, sid, bad_block)
        runtime.send_raw(raw)
        checks.answered_by_the_proxy(pair, runtime, split(raw)[0], (COMPRESSION_ERROR,))
        # kubelet's open call ends with a status, not a dead socket
        pair.pump(lambda: client.ended(sid), what="kubelet's call to end")
    checks.others_work(proxy)
