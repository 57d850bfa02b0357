"""HTTP/2 framing (RFC 9113) as far as a frame-level relay needs it.

The proxy forwards most frames byte for byte; it builds only the few frames
it injects (its own trailers, window updates, resets, GOAWAY, PING) and reads
only frame headers, SETTINGS, WINDOW_UPDATE and RST_STREAM payloads. `check`
holds the RFC's rules for a single frame in isolation (lengths, stream 0 or
not, padding, setting values), so the relay never reads a field past the end
of a frame nor forwards one the receiver would have to reject.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_LEN: Final = 9
#: A frame header in one C call: length (high octet, low 16 bits), type, flags, stream id (with its
#: reserved bit). `unpack_header(buf, pos)`; the pumps read every frame's header this way.
unpack_header: Final = struct.Struct(">BHBBI").unpack_from
#: Whether these modules run compiled (mypyc, setup.py; all of them or none, runtimeproxy.compiled), where
#: the pumps read a frame header with `read_header` instead of `unpack_header`
COMPILED: Final = not __file__.endswith(".py")


def read_header(buf: bytes, pos: int) -> tuple[int, int, int, int]:
    """A frame header's length, type, flags and stream id (reserved bit cleared), by bytes indexing.

    Compiled, this is native arithmetic returning an unboxed tuple; interpreted, `unpack_header` is cheaper.
    """
    return (
        buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2],
        buf[pos + 3],
        buf[pos + 4],
        (buf[pos + 5] & 0x7F) << 24 | buf[pos + 6] << 16 | buf[pos + 7] << 8 | buf[pos + 8],
    )

# frame types
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# flags
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# SETTINGS identifiers
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5

# error codes
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9

ERROR_NAMES: Final = {
    0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x2: "INTERNAL_ERROR", 0x3: "FLOW_CONTROL_ERROR",
    0x4: "SETTINGS_TIMEOUT", 0x5: "STREAM_CLOSED", 0x6: "FRAME_SIZE_ERROR", 0x7: "REFUSED_STREAM",
    0x8: "CANCEL", 0x9: "COMPRESSION_ERROR", 0xA: "CONNECT_ERROR", 0xB: "ENHANCE_YOUR_CALM",
    0xC: "INADEQUATE_SECURITY", 0xD: "HTTP_1_1_REQUIRED",
}

ENHANCE_YOUR_CALM: Final = 0xB

DEFAULT_WINDOW: Final = 65535
#: The smallest SETTINGS_MAX_FRAME_SIZE a peer may announce: frames the relay builds itself stay
#: within it, so they fit whatever either peer announced, acknowledged or not.
DEFAULT_MAX_FRAME: Final = 16384
MAX_FRAME_SIZE_LIMIT: Final = 2**24 - 1
MAX_WINDOW: Final = 2**31 - 1
MAX_WINDOW_INCREMENT: Final = MAX_WINDOW
MAX_STREAM_ID: Final = 2**31 - 1
#: A header block collected across CONTINUATIONs may grow to gRPC's own header list limit, no more.
MAX_HEADER_BLOCK: Final = 16 * 1024 * 1024
#: HEADERS flags that bring fields before the block: such a frame gets the full `check`
PADDED_OR_PRIORITY: Final = PADDED | PRIORITY_FLAG

#: gRPC status codes that HTTP/2 RST_STREAM error codes map to (gRPC's
#: PROTOCOL-HTTP2 document): CANCEL -> CANCELLED, the rest -> INTERNAL/UNAVAILABLE.
RST_TO_GRPC: Final = {0x0: 13, 0x1: 13, 0x2: 13, 0x3: 13, 0x4: 13, 0x6: 13, 0x7: 14, 0x8: 1, 0x9: 13, 0xB: 8, 0xC: 7}


@dataclass(frozen=True)
class Violation:
    """A frame the receiver must reject: an RFC 9113 error code, and whether only its stream dies."""

    code: int
    reason: str
    stream_only: bool = False

    @property
    def code_name(self) -> str:
        return ERROR_NAMES.get(self.code, hex(self.code))


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + (stream_id & 0x7FFFFFFF).to_bytes(4, "big") + payload
    )


def header_frames(stream_id: int, end_stream: bool, block: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """A header block as one HEADERS frame, or HEADERS and CONTINUATIONs when it exceeds `max_frame`."""
    first = END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return frame(HEADERS, first | END_HEADERS, stream_id, block)
    out = bytearray(frame(HEADERS, first, stream_id, block[:max_frame]))
    for start in range(max_frame, len(block), max_frame):
        last = start + max_frame >= len(block)
        out += frame(CONTINUATION, END_HEADERS if last else 0, stream_id, block[start : start + max_frame])
    return bytes(out)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def window_updates(stream_id: int, increment: int) -> bytes:
    """One or more WINDOW_UPDATE frames adding up to `increment` (each is capped at 2^31-1)."""
    out = bytearray()
    while increment > 0:
        step = min(increment, MAX_WINDOW_INCREMENT)
        out += window_update(stream_id, step)
        increment -= step
    return bytes(out)


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)


def ping(payload: bytes, *, ack: bool = False) -> bytes:
    return frame(PING, ACK if ack else 0, 0, payload)


def settings(values: dict[int, int] | None = None) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in (values or {}).items())
    return frame(SETTINGS, 0, 0, payload)


def settings_ack() -> bytes:
    return frame(SETTINGS, ACK, 0)


def parse_settings(payload: bytes | memoryview) -> dict[int, int]:
    """The settings of a SETTINGS payload `check` accepted (a multiple of 6 octets)."""
    return {
        int.from_bytes(payload[i : i + 2], "big"): int.from_bytes(payload[i + 2 : i + 6], "big")
        for i in range(0, len(payload) - 5, 6)
    }


def unpad(flags: int, payload: bytes | memoryview) -> bytes | memoryview:
    """The payload of a DATA frame `check` accepted, without its padding."""
    if flags & PADDED and payload:
        pad = payload[0]
        return payload[1 : len(payload) - pad]
    return payload


def header_block_fragment(flags: int, payload: bytes | memoryview) -> bytes | memoryview:
    """The header block fragment of a HEADERS frame `check` accepted: without padding and priority fields."""
    start = 0
    end = len(payload)
    if flags & PADDED:
        start = 1
        end -= payload[0]
    if flags & PRIORITY_FLAG:
        start += 5
    return payload[start:end]


def check(ftype: int, flags: int, sid: int, payload: bytes | memoryview, *, from_server: bool) -> Violation | None:
    """What RFC 9113 says is wrong with this frame on its own, if anything (stream state is the caller's).

    Connection errors unless `stream_only`; unknown frame types are fine (receivers ignore them).
    """
    n = len(payload)
    if ftype == WINDOW_UPDATE:
        if n != 4:
            return Violation(FRAME_SIZE_ERROR, f"WINDOW_UPDATE of {n} octets (must be 4)")
        if not int.from_bytes(payload, "big") & 0x7FFFFFFF:
            return Violation(PROTOCOL_ERROR, "WINDOW_UPDATE with an increment of 0", stream_only=sid != 0)
        return None
    if ftype in (HEADERS, DATA):
        name = "HEADERS" if ftype == HEADERS else "DATA"
        if sid == 0:
            return Violation(PROTOCOL_ERROR, f"{name} on stream 0")
        if ftype == HEADERS and not sid & 1:
            # push is off for gRPC, so every stream is client-initiated and odd
            return Violation(PROTOCOL_ERROR, f"HEADERS on even stream {sid}")
        fields = 0
        if flags & PADDED:
            if n < 1:
                return Violation(FRAME_SIZE_ERROR, f"padded {name} without a pad length")
            fields = 1 + payload[0]
        if ftype == HEADERS and flags & PRIORITY_FLAG:
            fields += 5
            off = 1 if flags & PADDED else 0
            if n >= off + 5 and int.from_bytes(payload[off : off + 4], "big") & 0x7FFFFFFF == sid:
                # a stream error by the RFC, taken as the connection's (which §5.4.1 allows): the block
                # would still have to be decoded and dropped, for a peer that is broken anyway
                return Violation(PROTOCOL_ERROR, f"stream {sid} depends on itself")
        if fields > n:
            return Violation(PROTOCOL_ERROR, f"{name} padding and fields ({fields} octets) exceed its {n} octets")
        return None
    if ftype == SETTINGS:
        if sid:
            return Violation(PROTOCOL_ERROR, f"SETTINGS on stream {sid}")
        if flags & ACK:
            return Violation(FRAME_SIZE_ERROR, f"SETTINGS ACK with {n} octets") if n else None
        if n % 6:
            return Violation(FRAME_SIZE_ERROR, f"SETTINGS of {n} octets (not a multiple of 6)")
        for ident, value in parse_settings(payload).items():
            if ident == SETTINGS_ENABLE_PUSH and (value > 1 or (value and from_server)):
                return Violation(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH={value}")
            if ident == SETTINGS_INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
                return Violation(FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE={value}")
            if ident == SETTINGS_MAX_FRAME_SIZE and not DEFAULT_MAX_FRAME <= value <= MAX_FRAME_SIZE_LIMIT:
                return Violation(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE={value}")
        return None
    if ftype == PING:
        if sid:
            return Violation(PROTOCOL_ERROR, f"PING on stream {sid}")
        return Violation(FRAME_SIZE_ERROR, f"PING of {n} octets (must be 8)") if n != 8 else None
    if ftype == CONTINUATION:
        return Violation(PROTOCOL_ERROR, "CONTINUATION on stream 0") if sid == 0 else None
    if ftype == RST_STREAM:
        if sid == 0:
            return Violation(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        return Violation(FRAME_SIZE_ERROR, f"RST_STREAM of {n} octets (must be 4)") if n != 4 else None
    if ftype == PRIORITY:
        if sid == 0:
            return Violation(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if n != 5:
            return Violation(FRAME_SIZE_ERROR, f"PRIORITY of {n} octets (must be 5)", stream_only=True)
        if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == sid:
            return Violation(PROTOCOL_ERROR, f"stream {sid} depends on itself", stream_only=True)
        return None
    if ftype == GOAWAY:
        if sid:
            return Violation(PROTOCOL_ERROR, f"GOAWAY on stream {sid}")
        return Violation(FRAME_SIZE_ERROR, f"GOAWAY of {n} octets (at least 8)") if n < 8 else None
    if ftype == PUSH_PROMISE:
        # gRPC never pushes and a client may not: the relay would also have to map pushed streams
        return Violation(PROTOCOL_ERROR, "PUSH_PROMISE (push is not enabled)")
    return None


INTERRUPTED_BLOCK: Final = Violation(PROTOCOL_ERROR, "a frame other than CONTINUATION inside a header block")


def oversized(length: int, limit: int) -> Violation:
    return Violation(FRAME_SIZE_ERROR, f"frame of {length} octets, over the peer's SETTINGS_MAX_FRAME_SIZE {limit}")


def continuation_error(block: tuple[bytearray, bytearray, int, int] | None, sid: int, length: int) -> Violation | None:
    """What is wrong with a CONTINUATION, given the header block being collected (raw frames, fragment, stream)."""
    if block is None:
        return Violation(PROTOCOL_ERROR, "CONTINUATION without a header block to continue")
    if block[2] != sid:
        return Violation(PROTOCOL_ERROR, f"CONTINUATION on stream {sid} inside stream {block[2]}'s header block")
    if len(block[0]) + length > MAX_HEADER_BLOCK:
        return Violation(ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_BLOCK} octets")
    return None
