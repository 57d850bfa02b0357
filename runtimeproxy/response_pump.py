"""runtime -> kubelet: the frames the runtime sends, read in place and written to kubelet in runs.

As in `request_pump`, frames pass in runs and only those the relay acts on cut
them: frames of a call kubelet already has its answer for (dropped; their
header blocks still read, `header_sync`), WINDOW_UPDATEs whose credit belongs
to the relay (`flow_control`), and the end of each call, whose status goes to
the handler once the answer was written to kubelet.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

from runtimeproxy import flow_control, grpc_framing, header_sync, peer_errors
from runtimeproxy import h2frames as h2
from runtimeproxy.calls import StreamKind
from runtimeproxy.grpc_framing import GRPC_INTERNAL, GRPC_UNKNOWN
from runtimeproxy.hpack_codec import Header, HPACKError
from runtimeproxy.relay_state import ConnectionState, Side, Stream

#: HEADERS flags whose frame takes the usual path: END_HEADERS and none of padding or priority
_PLAIN_MASK: Final = h2.END_HEADERS | h2.PADDED_OR_PRIORITY
_PASS: Final = StreamKind.PASS


def pump(conn: ConnectionState, data: bytes) -> None:
    """Relays what the runtime sent: frames checked, forwarded in runs, dropped where kubelet has its answer.

    What the pass writes to either peer goes out when it ends, one write per peer (`CorkedTransport`);
    the calls it finished are reported after that.
    """
    if conn.closing:
        return
    conn.cork()
    try:
        completed = _pump(conn, data)
    finally:
        conn.uncork()
    if completed and conn.done:
        _report_done(conn)


def _pump(conn: ConnectionState, data: bytes) -> bool:
    """One pass over what the runtime sent; False when it ended the connection pair."""
    buf = conn.bbuf + data if conn.bbuf else data
    n = len(buf)
    pos = 0
    out_start = 0
    client = conn.client
    hijacked = conn.hijacked
    limit = conn.backend_frame_limit
    unpack_header = h2.unpack_header
    compiled = h2.COMPILED
    in_block = conn.b_block is not None
    resp = conn.resp
    streams = conn.streams
    # one clock reading per pass: the calls it ends were answered in the same read
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
                client.write(buf[out_start:pos])
            peer_errors.connection_error(conn, Side.BACKEND, h2.oversized(length, limit))
            return False
        if end > n:
            break
        v: h2.Violation | None = None
        if in_block and ftype != h2.CONTINUATION:
            v = h2.INTERRUPTED_BLOCK
        elif ftype == h2.DATA:
            if sid == 0 or flags & h2.PADDED:
                v = h2.check(ftype, flags, sid, buf[pos + 9 : end], from_server=True)
            if v is not None:
                pass
            elif sid in hijacked:
                if out_start < pos:
                    client.write(buf[out_start:pos])
                out_start = end
                if length:
                    _backend_write(conn, h2.window_update(0, length))
            elif flags & h2.END_STREAM:
                _response_end(conn, sid, None)
        elif ftype == h2.HEADERS:
            if flags & _PLAIN_MASK == h2.END_HEADERS and sid & 1 and resp.reencoder is None and sid not in hijacked:
                # the usual block (whole, unpadded, on a stream kubelet waits for): read, forwarded in the run
                try:
                    headers = resp.decoder.decode(buf[pos + 9 : end])
                except HPACKError as exc:
                    if out_start < pos:
                        client.write(buf[out_start:pos])
                    peer_errors.connection_error(
                        conn, Side.BACKEND, h2.Violation(h2.COMPRESSION_ERROR, f"bad header block: {exc}")
                    )
                    return False
                if not flags & h2.END_STREAM:
                    if (st := streams.get(sid)) is not None:
                        st.responded = True
                else:
                    _response_end(conn, sid, headers, now=now)
                pos = end
                continue
            if flags & h2.PADDED_OR_PRIORITY or not sid & 1:  # the usual HEADERS needs no other check
                v = h2.check(ftype, flags, sid, buf[pos + 9 : end], from_server=True)
                # only a frame `check` accepted has its fields: a padded one may lack even the pad length
                fragment = h2.header_block_fragment(flags, buf[pos + 9 : end]) if v is None else b""
            else:
                fragment = buf[pos + 9 : end]
            if v is None:
                if flags & h2.END_HEADERS:
                    replacement = _block(conn, sid, flags, fragment)
                    if conn.closing:
                        return False
                    if replacement is not None:
                        if out_start < pos:
                            client.write(buf[out_start:pos])
                        out_start = end
                        if replacement:
                            client.write(replacement)
                else:
                    if out_start < pos:
                        client.write(buf[out_start:pos])
                    out_start = end
                    conn.b_block = (bytearray(buf[pos:end]), bytearray(fragment), sid, flags)
                    in_block = True
        elif ftype == h2.CONTINUATION:
            v = h2.continuation_error(conn.b_block, sid, length)
            if v is None:
                assert conn.b_block is not None
                if out_start < pos:
                    client.write(buf[out_start:pos])
                out_start = end
                raw, fragment_buf, bsid, bflags = conn.b_block
                raw += buf[pos:end]
                fragment_buf += buf[pos + 9 : end]
                if flags & h2.END_HEADERS:
                    conn.b_block = None
                    in_block = False
                    replacement = _block(conn, bsid, bflags, fragment_buf)
                    if conn.closing:
                        return False
                    if replacement is None:
                        client.write(bytes(raw))
                    elif replacement:
                        client.write(replacement)
        else:
            v = h2.check(ftype, flags, sid, buf[pos + 9 : end], from_server=True)
            if v is not None:
                pass
            elif ftype == h2.WINDOW_UPDATE:
                inc = int.from_bytes(buf[pos + 9 : end], "big") & 0x7FFFFFFF
                forward, passed, v = flow_control.backend_window_update(conn, sid, inc)
                if not forward:
                    if out_start < pos:
                        client.write(buf[out_start:pos])
                    out_start = end
                    if passed:
                        client.write(h2.window_update(0, passed))
            elif ftype == h2.SETTINGS:
                # the runtime's first frame; it reaches kubelet with this buffer's writes, before anything else
                conn.server_started = True
                if not flags & h2.ACK:
                    values = h2.parse_settings(buf[pos + 9 : end])
                    conn.b_settings.append(values)
                    if h2.SETTINGS_MAX_FRAME_SIZE in values:
                        conn.client_frame_limit = max(conn.client_frame_limit, values[h2.SETTINGS_MAX_FRAME_SIZE])
                elif conn.c_table_sizes and (size := conn.c_table_sizes.popleft()) >= 0:
                    # kubelet applies its new table size now: the relay's own next block may owe it an update
                    resp.decoder.table_size_acked(size)
            elif ftype == h2.GOAWAY:
                last = int.from_bytes(buf[pos + 9 : pos + 13], "big") & 0x7FFFFFFF
                if conn.runtime_goaway_sid is None or last < conn.runtime_goaway_sid:
                    conn.runtime_goaway_sid = last
            elif ftype == h2.RST_STREAM:
                if sid in hijacked:
                    if out_start < pos:
                        client.write(buf[out_start:pos])
                    out_start = end
                    del hijacked[sid]
                else:
                    _response_end(conn, sid, None, rst_code=int.from_bytes(buf[pos + 9 : end], "big"))
        if v is not None:
            if out_start < pos:
                client.write(buf[out_start:pos])
            out_start = end
            if not v.stream_only:
                peer_errors.connection_error(conn, Side.BACKEND, v)
                return False
            peer_errors.stream_error(conn, Side.BACKEND, sid, v)
        pos = end
    if out_start == 0 and pos == n:
        client.write(buf)
    elif out_start < pos:
        client.write(buf[out_start:pos])
    conn.bbuf = buf[pos:] if pos < n else b""
    return True


def _block(conn: ConnectionState, sid: int, flags: int, fragment: bytes | bytearray | memoryview) -> bytes | None:
    """Reads the runtime's header block: None to forward it, b"" to drop it, or frames to send instead."""
    path = conn.resp
    out: bytes | None = None
    try:
        if sid in conn.hijacked:  # kubelet already has its answer from the relay
            header_sync.drop(path, fragment)
            return b""
        if path.reencoder is None:
            headers = path.decoder.decode(fragment)
        else:
            headers, out = header_sync.reencode(path, fragment, sid, flags)
    except HPACKError as exc:
        peer_errors.connection_error(conn, Side.BACKEND, h2.Violation(h2.COMPRESSION_ERROR, f"bad header block: {exc}"))
        return b""
    if flags & h2.END_STREAM:
        _response_end(conn, sid, headers)
    elif (st := conn.streams.get(sid)) is not None:
        st.responded = True
    return out


def _report_done(conn: ConnectionState) -> None:
    done, conn.done = conn.done, []
    finished = conn.handler.finished
    for path, kind, message, code, seconds in done:
        finished(path, kind, message, code, seconds)


def _backend_write(conn: ConnectionState, data: bytes) -> None:
    if conn.backend is not None:
        conn.backend.write(data)


def _response_end(
    conn: ConnectionState, sid: int, headers: Sequence[Header] | None, *, rst_code: int | None = None,
    now: float | None = None,
) -> None:
    """The call on `sid` ended (trailers, or a reset): its gRPC status, recorded for the handler."""
    st = conn.streams.pop(sid, None)
    if st is None:
        return
    if rst_code is not None:
        code = h2.RST_TO_GRPC.get(rst_code, GRPC_INTERNAL)
    elif headers is not None and headers is conn.last_trailers[0]:
        # the decoder's cached block (the runtime's usual OK trailers): the same status
        code = conn.last_trailers[1]
    else:
        code = _status(headers or ())
        if headers is not None:
            conn.last_trailers = (headers, code)
    if st.kind is StreamKind.PASS:
        st.closed = True
        conn.done.append((st.path, _PASS, None, code, (time.perf_counter() if now is None else now) - st.t0))
        return
    _intercepted_end(conn, st, code)


def _intercepted_end(conn: ConnectionState, st: Stream, code: int) -> None:
    """An intercepted call's end: the request it made is kept for the handler (OBSERVE, post-call hooks)."""
    # an EDIT call the runtime answered before taking all of the held-back request
    # (e.g. Unimplemented): nothing more goes to it
    flow_control.abandon(conn, st)
    message: bytes | None = None
    if len(st.body) >= 5:
        body = st.body
        message = bytes(body[5:]) if not body[0] & 1 else grpc_framing.observed_message(body, st.encoding)
    # metrics and post-call hooks wait until the response is on its way to kubelet
    conn.done.append((st.path, st.kind, message, code, time.perf_counter() - st.t0))


def _status(headers: Sequence[Header]) -> int:
    """The gRPC status code of a call's last header block (UNKNOWN without a readable `grpc-status`)."""
    for name, value in headers:
        if name == b"grpc-status":
            try:
                return int(value)
            except ValueError:
                return GRPC_UNKNOWN
    return GRPC_UNKNOWN
