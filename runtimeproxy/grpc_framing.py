"""gRPC on the wire as the relay needs it: status codes, unary message framing, trailers it writes itself."""

from __future__ import annotations

import zlib

from runtimeproxy.calls import Refuse
from runtimeproxy.hpack_codec import Header, percent_encode

GRPC_OK = 0
GRPC_CANCELLED = 1
GRPC_UNKNOWN = 2
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14
GRPC_UNIMPLEMENTED = 12
GRPC_RESOURCE_EXHAUSTED = 8

#: The largest message the relay decompresses or holds: kubelet's 16 MiB message limit.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

#: `grpc-message` of the proxy's own trailers, percent-encoded, is cut to this many octets. grpc-core
#: clients fail a call whose metadata passes 8 KiB (grpc.max_metadata_size) and the runtime's own
#: answers stay far below; a hook's error text rarely says anything useful past the first lines.
MAX_STATUS_MESSAGE = 2048
_TRUNCATED = " ... (truncated)"

#: grpc-encoding -> zlib wbits: gzip is RFC 1952, deflate the zlib format of RFC 1950.
_WBITS = {b"gzip": 31, b"deflate": 15}


def grpc_message(body: bytes, encoding: bytes = b"") -> bytes | Refuse:
    """The one message of a unary request body (5-byte gRPC prefix + message), decompressed."""
    if len(body) < 5:
        return Refuse(GRPC_INTERNAL, "fgpu-runtime-proxy: request has no complete gRPC message")
    length = int.from_bytes(body[1:5], "big")
    if length != len(body) - 5:
        return Refuse(GRPC_INTERNAL, "fgpu-runtime-proxy: intercepted CRI calls must carry exactly one message")
    if not body[0] & 1:
        return body[5:]
    wbits = _WBITS.get(encoding)
    if wbits is None:
        # the gRPC spec's answer to a message in an encoding the server does not know
        name = encoding.decode(errors="replace") or "identity"
        return Refuse(
            GRPC_UNIMPLEMENTED,
            f"fgpu-runtime-proxy: a compressed message in grpc-encoding {name!r} cannot be intercepted "
            "(gzip and deflate can)",
        )
    inflater = zlib.decompressobj(wbits)
    try:
        message = inflater.decompress(body[5:], MAX_MESSAGE_BYTES)
    except zlib.error as exc:
        return Refuse(GRPC_INTERNAL, f"fgpu-runtime-proxy: cannot decompress the {encoding.decode()} request: {exc}")
    if inflater.unconsumed_tail:
        return Refuse(GRPC_RESOURCE_EXHAUSTED, f"fgpu-runtime-proxy: request larger than {MAX_MESSAGE_BYTES} bytes")
    return message


def observed_message(body: bytes | bytearray, encoding: bytes) -> bytes | None:
    """The message of an observed call for the post-call hooks, or None when it cannot be read."""
    message = grpc_message(bytes(body), encoding)
    return None if isinstance(message, Refuse) else message


def grpc_frame(message: bytes, encoding: bytes = b"") -> bytes:
    """A length-prefixed message; compressed (flag set) with `encoding` when it is gzip or deflate."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        return b"\x00" + len(message).to_bytes(4, "big") + message
    deflater = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = deflater.compress(message) + deflater.flush()
    return b"\x01" + len(packed).to_bytes(4, "big") + packed


def is_compressed(body: bytes | bytearray) -> bool:
    return bool(body) and bool(body[0] & 1)


def status_message(message: str, limit: int = MAX_STATUS_MESSAGE) -> bytes:
    """`message` percent-encoded for grpc-message, cut at a character boundary to at most `limit` octets."""
    encoded = percent_encode(message)
    if len(encoded) <= limit:
        return encoded
    budget = limit - len(_TRUNCATED)
    out = bytearray()
    for char in message:
        piece = percent_encode(char)
        if len(out) + len(piece) > budget:
            break
        out += piece
    return bytes(out) + _TRUNCATED.encode()


def trailer_fields(code: int, message: str, *, headers_sent: bool = False) -> list[Header]:
    """The fields of trailers with this status (a trailers-only response unless headers were sent)."""
    fields: list[Header] = []
    if not headers_sent:
        fields += [(b":status", b"200"), (b"content-type", b"application/grpc")]
    fields += [(b"grpc-status", str(code).encode()), (b"grpc-message", status_message(message))]
    return fields
