"""Keeping both peers' HPACK tables in step when the relay forwards, drops or writes a header block.

The relay forwards header blocks byte for byte, so the receiver's table is the
sender's. A block it must not forward (the runtime's answer on a call the proxy
already refused, kubelet's request on a stream refused while draining) may
still have changed the sender's table; if it did, the receiver's table now
lags, and the next block that refers to the new entries would break the whole
connection. From that block on the relay re-encodes that direction against the
table the receiver really has (`TableEncoder`, seeded with the table as it was
before the dropped block). That costs a few microseconds a block, only on a
connection where it happened; every other connection keeps the byte-for-byte path.

The relay's own blocks (trailers) use literals without indexing, which change
no table; once the relay owns the receiver's table they go through its encoder
too, so a size update the receiver waits for comes first.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtimeproxy import grpc_framing
from runtimeproxy import h2frames as h2
from runtimeproxy.hpack_codec import Header, TableEncoder, leading_size_updates
from runtimeproxy.relay_state import HeaderPath


def drop(path: HeaderPath, fragment: bytes | bytearray | memoryview) -> Sequence[Header]:
    """Reads a block the receiver will not see (raises HPACKError), and takes over its table if needed."""
    decoder = path.decoder
    if path.reencoder is not None:
        headers = decoder.decode(fragment)
        path.reencoder.resize(leading_size_updates(fragment))
        return headers
    before = decoder.generation
    entries, max_size = decoder.snapshot()
    headers = decoder.decode(fragment)
    if decoder.generation != before:
        path.reencoder = TableEncoder(entries, max_size)
        path.reencoder.resize(leading_size_updates(fragment))
    return headers


def reencode(path: HeaderPath, fragment: bytes | bytearray | memoryview, sid: int, flags: int) -> tuple[Sequence[Header], bytes]:
    """Reads a block to forward once the receiver's table is the relay's: its fields, and frames for the receiver."""
    assert path.reencoder is not None
    headers = path.decoder.decode(fragment)
    path.reencoder.resize(leading_size_updates(fragment))
    block = path.reencoder.encode(headers)
    return headers, h2.header_frames(sid, bool(flags & h2.END_STREAM), block)


def trailers(path: HeaderPath, sid: int, code: int, message: str, *, headers_sent: bool = False) -> bytes:
    """The relay's own trailers ending a call with this gRPC status, for the receiver of `path`."""
    return path.own_block(sid, grpc_framing.trailer_fields(code, message, headers_sent=headers_sent))
