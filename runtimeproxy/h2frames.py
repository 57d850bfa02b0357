"""HTTP/2 framing (RFC 9113) as far as a frame-level relay needs it.

The proxy forwards most frames byte for byte; it builds only the few frames
it injects (its own trailers, window updates, resets) and reads only frame
headers, SETTINGS and WINDOW_UPDATE payloads.
"""

from __future__ import annotations

from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_LEN: Final = 9

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
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5

# error codes
NO_ERROR: Final = 0x0
INTERNAL_ERROR: Final = 0x2
CANCEL: Final = 0x8

DEFAULT_WINDOW: Final = 65535
DEFAULT_MAX_FRAME: Final = 16384
MAX_WINDOW_INCREMENT: Final = 2**31 - 1

#: gRPC status codes that HTTP/2 RST_STREAM error codes map to (gRPC's
#: PROTOCOL-HTTP2 document): CANCEL -> CANCELLED, the rest -> INTERNAL/UNAVAILABLE.
RST_TO_GRPC: Final = {0x0: 13, 0x1: 13, 0x2: 13, 0x3: 13, 0x4: 13, 0x6: 13, 0x7: 14, 0x8: 1, 0x9: 13, 0xB: 8, 0xC: 7}


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + (stream_id & 0x7FFFFFFF).to_bytes(4, "big") + payload
    )


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


def settings(values: dict[int, int] | None = None) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in (values or {}).items())
    return frame(SETTINGS, 0, 0, payload)


def settings_ack() -> bytes:
    return frame(SETTINGS, ACK, 0)


def parse_settings(payload: bytes | memoryview) -> dict[int, int]:
    return {
        int.from_bytes(payload[i : i + 2], "big"): int.from_bytes(payload[i + 2 : i + 6], "big")
        for i in range(0, len(payload) - 5, 6)
    }


def unpad(flags: int, payload: bytes | memoryview) -> bytes | memoryview:
    """The frame payload without its padding (DATA, HEADERS)."""
    if flags & PADDED and payload:
        pad = payload[0]
        return payload[1 : len(payload) - pad]
    return payload


def header_block_fragment(flags: int, payload: bytes | memoryview) -> bytes | memoryview:
    """The header block fragment of a HEADERS frame: without padding and priority fields."""
    start = 0
    end = len(payload)
    if flags & PADDED:
        start = 1
        end -= payload[0]
    if flags & PRIORITY_FLAG:
        start += 5
    return payload[start:end]
