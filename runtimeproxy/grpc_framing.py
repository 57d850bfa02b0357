"""gRPC on the wire as the relay needs it: status codes, unary message framing, trailers it writes itself."""

from __future__ import annotations

from runtimeproxy import h2frames as h2
from runtimeproxy.calls import Refuse
from runtimeproxy.hpack_codec import Header, encode_unindexed, percent_encode

GRPC_OK = 0
GRPC_CANCELLED = 1
GRPC_UNKNOWN = 2
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14
GRPC_UNIMPLEMENTED = 12
GRPC_RESOURCE_EXHAUSTED = 8


def grpc_message(body: bytes) -> bytes | Refuse:
    """The one message of a unary request body (5-byte gRPC prefix + message)."""
    if len(body) < 5:
        return Refuse(GRPC_INTERNAL, "fgpu-runtime-proxy: request has no complete gRPC message")
    if body[0] & 1:
        return Refuse(
            GRPC_UNIMPLEMENTED,
            "fgpu-runtime-proxy: compressed requests are not supported for intercepted CRI calls; "
            "send them uncompressed (kubelet does)",
        )
    length = int.from_bytes(body[1:5], "big")
    if length != len(body) - 5:
        return Refuse(GRPC_INTERNAL, "fgpu-runtime-proxy: intercepted CRI calls must carry exactly one message")
    return body[5:]


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def trailers(sid: int, code: int, message: str, *, headers_sent: bool = False) -> bytes:
    """A HEADERS frame ending the stream with this status; literal fields leave kubelet's HPACK table alone."""
    fields: list[Header] = []
    if not headers_sent:
        fields += [(b":status", b"200"), (b"content-type", b"application/grpc")]
    fields += [(b"grpc-status", str(code).encode()), (b"grpc-message", percent_encode(message))]
    return h2.frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, sid, encode_unindexed(fields))
