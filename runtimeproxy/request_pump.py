"""kubelet -> runtime: the frames kubelet sends, read in place and written to the runtime in runs.

The bytes kubelet sends are cut into frames; frames that pass unchanged stay
in one run that is written with a single call, and only the frames the relay
acts on cut the run: the DATA of a held call (kept for the handler, kubelet
credited by the relay), a header block to drop or re-encode (`header_sync`),
a stream refused while draining, kubelet's ACK of the runtime's SETTINGS
(written before anything the relay sends under them) and of the relay's own
PING. Every frame is checked first (`h2frames.check`, the runtime's frame
size); a bad one goes to `peer_errors`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Final

from runtimeproxy import draining, flow_control, header_sync, held_calls, peer_errors, refusal
from runtimeproxy import h2frames as h2
from runtimeproxy.calls import StreamKind
from runtimeproxy.grpc_framing import GRPC_CANCELLED
from runtimeproxy.hpack_codec import Header, HPACKError
from runtimeproxy.relay_state import MAX_HELD_BYTES, ConnectionState, Drain, Side, Stream

log = logging.getLogger(__name__)

#: HEADERS flags whose frame takes the usual path: END_HEADERS and none of padding or priority
_PLAIN_MASK: Final = h2.END_HEADERS | h2.PADDED_OR_PRIORITY
_PASS: Final = StreamKind.PASS


def pump(conn: ConnectionState, data: bytes) -> None:
    """Relays what kubelet sent: frames checked, forwarded in runs, held or dropped where the relay must.

    What the pass writes to either peer goes out when it ends, one write per peer (`CorkedTransport`).
    """
    if conn.closing:
        return
    conn.cork()
    try:
        _pump(conn, data)
    finally:
        conn.uncork()


def _pump(conn: ConnectionState, data: bytes) -> None:
    if conn.backend is None:
        conn.cbuf += data
        if conn.refusing is not None:
            refusal.refuse_pending(conn)
        return
    buf = conn.cbuf + data if conn.cbuf else data
    n = len(buf)
    pos = 0
    if not conn.preface_seen:
        if n < len(h2.PREFACE):
            conn.cbuf = buf
            return
        if buf[: len(h2.PREFACE)] != h2.PREFACE:
            log.warning("%s sent no HTTP/2 preface; closing", peer_errors.describe(conn, Side.CLIENT))
            conn.close()
            return
        conn.preface_seen = True
        pos = len(h2.PREFACE)
    out_start = 0
    backend = conn.backend
    streams = conn.streams
    limit = conn.client_frame_limit
    unpack_header = h2.unpack_header
    compiled = h2.COMPILED
    in_block = conn.c_block is not None
    req = conn.req
    # one clock reading per pass: the calls it opens arrived in the same read
    now = time.perf_counter()
    # typed, so that a compiled build (mypyc) does native arithmetic on the header's fields
    hi: int
    lo: int
    ftype: int
    flags: int
    sid: int
    while n - pos >= 9:
        if compiled:
            length, ftype, flags, sid = h2.read_header(buf, pos)
        else:
            hi, lo, ftype, flags, sid = unpack_header(buf, pos)
            length = hi << 16 | lo
            sid &= 0x7FFFFFFF
        end = pos + 9 + length
        if length > limit:
            if out_start < pos:
                backend.write(buf[out_start:pos])
            peer_errors.connection_error(conn, Side.CLIENT, h2.oversized(length, limit))
            return
        if end > n:
            break
        v: h2.Violation | None = None
        if in_block and ftype != h2.CONTINUATION:
            v = h2.INTERRUPTED_BLOCK
        elif ftype == h2.DATA:
            if sid == 0 or flags & h2.PADDED:
                v = h2.check(ftype, flags, sid, buf[pos + 9 : end], from_server=False)
            if v is not None:
                pass
            elif (st := streams.get(sid)) is not None and st.kind is StreamKind.EDIT:
                if out_start < pos:
                    backend.write(buf[out_start:pos])
                out_start = end
                st.received += length
                if len(st.body) <= MAX_HELD_BYTES:
                    st.body += h2.unpad(flags, buf[pos + 9 : end])
                else:
                    st.oversized = True
                # the runtime sees none of this yet, so the credit kubelet needs comes from here
                if length:
                    credit = h2.window_update(0, length)
                    if not flags & h2.END_STREAM:
                        credit += h2.window_update(sid, length)
                    conn.client.write(credit)
                if flags & h2.END_STREAM:
                    held_calls.start_edit(conn, st)
            elif conn.refused and sid in conn.refused:
                # a refused stream's DATA never reaches the runtime: kubelet's credit comes from here
                if out_start < pos:
                    backend.write(buf[out_start:pos])
                out_start = end
                if length:
                    conn.client.write(h2.window_update(0, length))
            else:
                if st is not None and st.kind is StreamKind.OBSERVE:
                    st.body += h2.unpad(flags, buf[pos + 9 : end])
                if conn.queue or conn.bwin < length:
                    if out_start < pos:
                        backend.write(buf[out_start:pos])
                    out_start = end
                    conn.queue.append((buf[pos:end], length))
                else:
                    conn.bwin -= length
        elif ftype == h2.HEADERS:
            if (
                flags & _PLAIN_MASK == h2.END_HEADERS and sid & 1 and sid > conn.last_sid
                and conn.goaway_sid is None and req.reencoder is None
            ):
                # the usual request: a new stream's whole, unpadded block, read and forwarded in the run
                try:
                    headers = req.decoder.decode(buf[pos + 9 : end])
                except HPACKError as exc:
                    if out_start < pos:
                        backend.write(buf[out_start:pos])
                    peer_errors.connection_error(
                        conn, Side.CLIENT, h2.Violation(h2.COMPRESSION_ERROR, f"bad header block: {exc}")
                    )
                    return
                _open(conn, sid, flags, headers, now)
                pos = end
                continue
            if flags & h2.PADDED_OR_PRIORITY or not sid & 1:  # the usual HEADERS needs no other check
                v = h2.check(ftype, flags, sid, buf[pos + 9 : end], from_server=False)
                # only a frame `check` accepted has its fields: a padded one may lack even the pad length
                fragment = h2.header_block_fragment(flags, buf[pos + 9 : end]) if v is None else b""
            else:
                fragment = buf[pos + 9 : end]
            if v is None:
                if flags & h2.END_HEADERS:
                    replacement = _block(conn, sid, flags, fragment)
                    if conn.closing:
                        return
                    if replacement is not None:
                        if out_start < pos:
                            backend.write(buf[out_start:pos])
                        out_start = end
                        if replacement:
                            backend.write(replacement)
                else:
                    if out_start < pos:
                        backend.write(buf[out_start:pos])
                    out_start = end
                    conn.c_block = (bytearray(buf[pos:end]), bytearray(fragment), sid, flags)
                    in_block = True
        elif ftype == h2.CONTINUATION:
            v = h2.continuation_error(conn.c_block, sid, length)
            if v is None:
                assert conn.c_block is not None
                if out_start < pos:
                    backend.write(buf[out_start:pos])
                out_start = end
                raw, fragment_buf, bsid, bflags = conn.c_block
                raw += buf[pos:end]
                fragment_buf += buf[pos + 9 : end]
                if flags & h2.END_HEADERS:
                    conn.c_block = None
                    in_block = False
                    replacement = _block(conn, bsid, bflags, fragment_buf)
                    if conn.closing:
                        return
                    if replacement is None:
                        backend.write(bytes(raw))
                    elif replacement:
                        backend.write(replacement)
        else:
            v = h2.check(ftype, flags, sid, buf[pos + 9 : end], from_server=False)
            if v is not None:
                pass
            elif ftype == h2.SETTINGS:
                if not flags & h2.ACK:
                    values = h2.parse_settings(buf[pos + 9 : end])
                    conn.c_table_sizes.append(values.get(h2.SETTINGS_HEADER_TABLE_SIZE, -1))
                    if h2.SETTINGS_MAX_FRAME_SIZE in values:
                        conn.backend_frame_limit = max(conn.backend_frame_limit, values[h2.SETTINGS_MAX_FRAME_SIZE])
                elif conn.b_settings:
                    # the ACK reaches the runtime before anything the relay sends under the new values
                    backend.write(buf[out_start:end])
                    out_start = end
                    v = flow_control.backend_settings_acked(conn, conn.b_settings.popleft())
                    if v is not None:
                        peer_errors.connection_error(conn, Side.BACKEND, v)
                        return
            elif ftype == h2.WINDOW_UPDATE or ftype == h2.RST_STREAM:
                if conn.refused and sid in conn.refused:
                    if out_start < pos:
                        backend.write(buf[out_start:pos])
                    out_start = end
                elif ftype == h2.RST_STREAM and (st := streams.pop(sid, None)) is not None:
                    _cancelled(conn, st)
            elif (
                ftype == h2.PING and flags & h2.ACK and conn.drain is Drain.PINGED
                and buf[pos + 9 : end] == draining.DRAIN_PING
            ):
                if out_start < pos:
                    backend.write(buf[out_start:pos])
                out_start = end
                draining.ping_acked(conn)
        if v is not None:
            if out_start < pos:
                backend.write(buf[out_start:pos])
            out_start = end
            if not v.stream_only:
                peer_errors.connection_error(conn, Side.CLIENT, v)
                return
            peer_errors.stream_error(conn, Side.CLIENT, sid, v)
        pos = end
    if out_start == 0 and pos == n:
        backend.write(buf)
    elif out_start < pos:
        backend.write(buf[out_start:pos])
    conn.cbuf = buf[pos:] if pos < n else b""


def _block(conn: ConnectionState, sid: int, flags: int, fragment: bytes | bytearray | memoryview) -> bytes | None:
    """Reads kubelet's header block and registers a new stream: None to forward it, b"" to drop it, or frames."""
    st = conn.streams.get(sid)
    new = st is None and sid > conn.last_sid
    path = conn.req
    out: bytes | None = None
    try:
        if new and conn.goaway_sid is not None and sid > conn.goaway_sid:
            conn.last_sid = sid
            header_sync.drop(path, fragment)
            draining.refuse_stream(conn, sid)
            return b""
        if st is None and not new and sid in conn.refused:
            header_sync.drop(path, fragment)
            return b""
        if st is not None and st.kind is StreamKind.EDIT and st.task is None and flags & h2.END_STREAM:
            # kubelet ends the held request with trailers: they would end it at the runtime before the held
            # message, so they follow the edited message instead (`flow_control.send_pending`)
            st.trailers = header_sync.drop(path, fragment)
            held_calls.start_edit(conn, st)
            return b""
        if path.reencoder is None:
            headers = path.decoder.decode(fragment)
        else:
            headers, out = header_sync.reencode(path, fragment, sid, flags)
    except HPACKError as exc:
        peer_errors.connection_error(conn, Side.CLIENT, h2.Violation(h2.COMPRESSION_ERROR, f"bad header block: {exc}"))
        return b""
    if st is not None:  # trailers from the client; gRPC clients send none, but be correct
        if flags & h2.END_STREAM and st.kind is StreamKind.EDIT:
            held_calls.start_edit(conn, st)
        return out
    if not new:  # a stream the runtime already ended: the runtime answers for it
        return out
    _open(conn, sid, flags, headers, time.perf_counter())
    return out


def _open(conn: ConnectionState, sid: int, flags: int, headers: Sequence[Header], now: float) -> None:
    """Registers kubelet's new stream `sid` with its request headers."""
    conn.last_sid = sid
    if headers is conn.last_request[0]:
        # the decoder's cached block (the same request block again): the same call
        path_value = conn.last_request[1]
    else:
        path_value = _path(headers)
        conn.last_request = (headers, path_value)
    # classified afresh for every stream: hook registrations come and go
    st = Stream(sid, path_value, conn.handler.classify(path_value), now)
    conn.streams[sid] = st
    if st.kind is not _PASS:
        _intercepted(conn, st, flags, headers)


def _path(headers: Sequence[Header]) -> bytes:
    for name, value in headers:
        if name == b":path":
            return value
    return b""


def _intercepted(conn: ConnectionState, st: Stream, flags: int, headers: Sequence[Header]) -> None:
    """A new stream the handler intercepts: its request's encoding, and an EDIT call's window and start."""
    for name, value in headers:
        if name == b"grpc-encoding":
            st.encoding = value
            break
    if st.kind is StreamKind.EDIT:
        st.window = conn.b_initial_window
        if flags & h2.END_STREAM:
            held_calls.start_edit(conn, st)


def _cancelled(conn: ConnectionState, st: Stream) -> None:
    flow_control.abandon(conn, st)
    conn.handler.finished(st.path, st.kind, None, GRPC_CANCELLED, time.perf_counter() - st.t0)
