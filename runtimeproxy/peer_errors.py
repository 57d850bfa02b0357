"""Frames a peer must not send, and a peer gone: the RFC's answer on this connection pair, and nowhere else.

A connection error closes this kubelet connection and its runtime connection,
after a GOAWAY carrying the RFC 9113 error code to the peer that broke the
protocol; kubelet's calls still open get a gRPC status rather than a cut. A
stream error resets that stream on both sides and nothing else. Each logs
one line naming the peer (kubelet's process id from the socket, or the
runtime's address).
"""

from __future__ import annotations

import logging
import socket
import struct
import time

from runtimeproxy import flow_control, header_sync
from runtimeproxy import h2frames as h2
from runtimeproxy.grpc_framing import GRPC_CANCELLED, GRPC_INTERNAL, GRPC_UNAVAILABLE
from runtimeproxy.relay_state import ConnectionState, Side, remember

log = logging.getLogger(__name__)

_DEBUG_MAX = 256


def describe(conn: ConnectionState, side: Side) -> str:
    """The peer as a log line should name it: `runtime unix:///...`, `kubelet pid=... uid=...`."""
    if side is Side.BACKEND:
        return f"runtime {conn.relay.backend_name}"
    sock = conn.client.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX and hasattr(socket, "SO_PEERCRED"):
        try:
            pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        except OSError:
            return "kubelet"
        return f"kubelet pid={pid} uid={uid}"
    peer = conn.client.get_extra_info("peername")
    return f"kubelet {peer}" if peer else "kubelet"


def connection_error(conn: ConnectionState, side: Side, violation: h2.Violation) -> None:
    """GOAWAY with the error code to the peer at fault, then both connections close."""
    if conn.closing:
        return
    log.warning(
        "HTTP/2 connection error from %s: %s (%s); closing this connection pair",
        describe(conn, side), violation.reason, violation.code_name,
    )
    debug = violation.reason.encode()[:_DEBUG_MAX]
    if side is Side.CLIENT:
        # a server's first frame must be SETTINGS (RFC 9113 §3.4), even before a GOAWAY
        preface = b"" if conn.server_started else h2.settings()
        conn.client.write(preface + h2.goaway(conn.goaway_last_sid(), violation.code, debug))
        if conn.backend is not None:
            conn.backend.write(h2.goaway(0, h2.NO_ERROR))
    else:
        if conn.backend is not None:
            conn.backend.write(h2.goaway(0, violation.code, debug))
        fail_open_calls(
            conn,
            f"fgpu-runtime-proxy: the container runtime at {conn.relay.backend_name} broke the HTTP/2 protocol "
            f"({violation.code_name}: {violation.reason})",
        )
    conn.close()


def stream_error(conn: ConnectionState, side: Side, sid: int, violation: h2.Violation) -> None:
    """RST_STREAM with the error code to the peer at fault; the other side's half of the call ends too."""
    if sid > conn.last_sid:
        # RFC 9113 §6.4: no RST_STREAM on an idle stream, so the error takes the connection
        connection_error(conn, side, violation)
        return
    log.warning(
        "HTTP/2 stream error from %s on stream %d: %s (%s); resetting the stream",
        describe(conn, side), sid, violation.reason, violation.code_name,
    )
    st = conn.streams.pop(sid, None)
    if st is not None:
        flow_control.abandon(conn, st)
    remember(conn.hijacked, sid)
    if side is Side.CLIENT:
        conn.client.write(h2.rst_stream(sid, violation.code))
        if conn.backend is not None and sid not in conn.refused:
            conn.backend.write(h2.rst_stream(sid, h2.CANCEL))
        if st is not None:
            conn.handler.finished(st.path, st.kind, None, GRPC_CANCELLED, time.perf_counter() - st.t0)
        return
    if conn.backend is not None:
        conn.backend.write(h2.rst_stream(sid, violation.code))
    if st is not None:
        message = f"fgpu-runtime-proxy: the container runtime broke the HTTP/2 protocol on this call ({violation.reason})"
        conn.client.write(header_sync.trailers(conn.resp, sid, GRPC_INTERNAL, message, headers_sent=st.responded))
        conn.handler.finished(st.path, st.kind, None, GRPC_INTERNAL, time.perf_counter() - st.t0)


def fail_open_calls(conn: ConnectionState, message: str) -> None:
    """Ends each of kubelet's open calls with UNAVAILABLE and this message, then says GOAWAY to kubelet.

    A call above the last stream id of the runtime's GOAWAY was never run: it is refused
    (REFUSED_STREAM), which tells kubelet it may send it again.
    """
    out = bytearray()
    if not conn.server_started:
        # a server's first frame must be SETTINGS (RFC 9113 §3.4)
        out += h2.settings()
        conn.server_started = True
    unrun = h2.MAX_STREAM_ID if conn.runtime_goaway_sid is None else conn.runtime_goaway_sid
    for st in conn.streams.values():
        if st.closed:
            continue
        if st.sid > unrun:
            out += h2.rst_stream(st.sid, h2.REFUSED_STREAM)
        else:
            out += header_sync.trailers(conn.resp, st.sid, GRPC_UNAVAILABLE, message, headers_sent=st.responded)
    out += h2.goaway(conn.goaway_last_sid(), h2.NO_ERROR)
    conn.client.write(bytes(out))
