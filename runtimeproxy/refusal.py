"""No runtime: the connection answers kubelet as a tiny HTTP/2 server that fails every call, then closes."""

from __future__ import annotations

import asyncio
import logging

from runtimeproxy import h2frames as h2
from runtimeproxy.grpc_framing import GRPC_UNAVAILABLE, trailer_fields
from runtimeproxy.hpack_codec import encode_size_updates, encode_unindexed
from runtimeproxy.relay_state import ConnectionState, remember

log = logging.getLogger(__name__)

#: how long kubelet gets to send the calls it already queued, so they get the reason too
_LINGER_S = 0.2


def refuse_all(conn: ConnectionState, reason: str) -> None:
    """Answers kubelet as a tiny HTTP/2 server that fails every call, then closes."""
    if conn.closing:
        return
    conn.refusing = reason
    conn.server_started = True
    conn.client.write(h2.settings())
    refuse_pending(conn)
    asyncio.get_running_loop().call_later(_LINGER_S, finish, conn)


def refuse_pending(conn: ConnectionState) -> None:
    """Answers what kubelet sent so far: SETTINGS and PING acknowledged, every call failed with the reason."""
    assert conn.refusing is not None
    buf = conn.cbuf
    pos = 0
    if not conn.preface_seen:
        if len(buf) < len(h2.PREFACE):
            return
        conn.preface_seen = True
        pos = len(h2.PREFACE)
    out = bytearray()
    while len(buf) - pos >= 9:
        length = int.from_bytes(buf[pos : pos + 3], "big")
        end = pos + 9 + length
        if end > len(buf):
            break
        ftype, flags = buf[pos + 3], buf[pos + 4]
        sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        violation = h2.check(ftype, flags, sid, buf[pos + 9 : end], from_server=False)
        if violation is not None and not violation.stream_only:
            log.warning("HTTP/2 connection error from kubelet: %s (%s)", violation.reason, violation.code_name)
            conn.client.write(bytes(out) + h2.goaway(conn.last_sid, violation.code, violation.reason.encode()))
            conn.close()
            return
        if ftype == h2.SETTINGS and not flags & h2.ACK:
            out += h2.settings_ack()
        elif ftype == h2.PING and not flags & h2.ACK:
            out += h2.ping(buf[pos + 9 : end], ack=True)
        elif ftype == h2.HEADERS and sid not in conn.hijacked:
            remember(conn.hijacked, sid)
            conn.last_sid = max(conn.last_sid, sid)
            # a size update to 0 first: kubelet may have lowered its table in SETTINGS this just acknowledged,
            # and then rejects a block without one (RFC 7541 4.2); the relay's blocks use no table anyway
            block = encode_size_updates([0]) + encode_unindexed(trailer_fields(GRPC_UNAVAILABLE, conn.refusing))
            out += h2.header_frames(sid, True, block)
        elif ftype == h2.DATA and length:
            out += h2.window_update(0, length)
        pos = end
    conn.cbuf = buf[pos:]
    if out:
        conn.client.write(bytes(out))


def finish(conn: ConnectionState) -> None:
    if not conn.closing:
        conn.client.write(h2.goaway(conn.goaway_last_sid(), h2.NO_ERROR, b"container runtime unreachable"))
        conn.close()
