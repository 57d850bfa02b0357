"""Flow control toward the runtime: its windows, DATA queued while they are short, credit withheld from kubelet.

kubelet's own DATA is forwarded under kubelet's own accounting; only what the
relay sends itself (the edited message of a held call) is counted here,
against the runtime's stream window of that call and the connection window
both share (`bwin`, reduced by every DATA frame that goes to the runtime).
"""

from __future__ import annotations

from runtimeproxy import h2frames as h2
from runtimeproxy.calls import StreamKind
from runtimeproxy.relay_state import ConnectionState, Stream


def abandon(conn: ConnectionState, st: Stream) -> None:
    """The call ended before its held-back request fully reached the runtime: stop, settle credit."""
    st.closed = True
    if st.kind is not StreamKind.EDIT:
        return
    if st.task is not None and not st.task.done():
        st.task.cancel()
    if st.settled and st.pending is not None:
        # never sent, so the runtime will not return credit for it: stop withholding that much. The
        # withheld count is shared by all held calls, and the runtime's credit for kubelet's own DATA may
        # already have been kept against it (while this call waited for its stream window): what this
        # call can no longer account for is kubelet's, and goes back to kubelet now.
        conn.withhold -= len(st.pending)
        if conn.withhold < 0:
            owed, conn.withhold = -conn.withhold, 0
            if not conn.closing:
                conn.client.write(h2.window_updates(0, owed))
    st.pending = None
    if st in conn.blocked:
        conn.blocked.remove(st)


def send(conn: ConnectionState, st: Stream, payload: bytes) -> None:
    """Sends the edited message of a held call, now or as the runtime's windows open."""
    st.settled = True
    # kubelet was credited when the relay took its bytes; what the runtime returns for these is not kubelet's
    conn.withhold += len(payload)
    st.pending = memoryview(payload)
    send_pending(conn, st)
    if st.pending is not None:
        conn.blocked.append(st)


def send_pending(conn: ConnectionState, st: Stream) -> None:
    assert conn.backend is not None
    pending = st.pending
    if pending is None:
        return
    if not pending:
        if st.trailers is None:
            conn.backend.write(h2.frame(h2.DATA, h2.END_STREAM, st.sid))
        else:
            conn.backend.write(conn.req.own_block(st.sid, st.trailers))
        st.pending = None
        return
    out = bytearray()
    while pending and not conn.queue:
        n = min(len(pending), st.window, conn.bwin, conn.b_max_frame)
        if n <= 0:
            break
        chunk = pending[:n]
        pending = pending[n:]
        st.window -= n
        conn.bwin -= n
        out += h2.frame(h2.DATA, 0 if pending or st.trailers is not None else h2.END_STREAM, st.sid, bytes(chunk))
        if not pending and st.trailers is not None:
            out += conn.req.own_block(st.sid, st.trailers)
    if out:
        conn.backend.write(bytes(out))
    st.pending = pending if pending else None


def backend_settings_acked(conn: ConnectionState, values: dict[int, int]) -> h2.Violation | None:
    """Applies runtime SETTINGS that kubelet has acknowledged (and the ACK already went to the runtime).

    The relay sends under them only now: the runtime counts on new values once it
    has the ACK, so nothing the relay sends under them may reach it before the ACK.
    """
    if h2.SETTINGS_INITIAL_WINDOW_SIZE in values:
        new = values[h2.SETTINGS_INITIAL_WINDOW_SIZE]
        diff = new - conn.b_initial_window
        conn.b_initial_window = new
        # RFC 9113 §6.9.2: open streams' windows move by the difference, up or down
        for st in conn.streams.values():
            if st.kind is StreamKind.EDIT:
                st.window += diff
                if st.window > h2.MAX_WINDOW:
                    return h2.Violation(h2.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream window")
    if h2.SETTINGS_MAX_FRAME_SIZE in values:
        conn.b_max_frame = values[h2.SETTINGS_MAX_FRAME_SIZE]
    if h2.SETTINGS_HEADER_TABLE_SIZE in values:
        # the relay's own blocks to the runtime (a held request's trailers) may owe it a size update
        conn.req.decoder.table_size_acked(values[h2.SETTINGS_HEADER_TABLE_SIZE])
    drain(conn)
    return None


def drain(conn: ConnectionState) -> None:
    """Sends what waited for the runtime's windows: kubelet's queued DATA first, in order, then held calls'."""
    if conn.backend is None:
        return
    while conn.queue and conn.bwin >= conn.queue[0][1]:
        frame_bytes, length = conn.queue.popleft()
        conn.bwin -= length
        conn.backend.write(frame_bytes)
    if conn.blocked and not conn.queue:
        for st in list(conn.blocked):
            send_pending(conn, st)
            if st.pending is None:
                conn.blocked.remove(st)


def backend_window_update(conn: ConnectionState, sid: int, inc: int) -> tuple[bool, int, h2.Violation | None]:
    """Books a runtime WINDOW_UPDATE: (forward it to kubelet as is, connection credit to pass on instead, error).

    Connection credit the runtime returns for what the relay sent itself is withheld; stream credit for a
    held call is the relay's, and also kubelet's while kubelet still sends the request: the relay credits
    kubelet only for DATA it received, so a runtime that starts streams at window 0 and opens them with
    WINDOW_UPDATEs (RFC 9113 6.9.2 allows it) would otherwise leave kubelet unable to send a byte.
    """
    if sid == 0:
        conn.bwin += inc
        if conn.bwin > h2.MAX_WINDOW:
            return False, 0, h2.Violation(h2.FLOW_CONTROL_ERROR, "connection window above 2^31-1")
        forward, passed = True, 0
        if conn.withhold:
            kept = min(conn.withhold, inc)
            conn.withhold -= kept
            forward, passed = False, inc - kept
        drain(conn)
        return forward, passed, None
    st = conn.streams.get(sid)
    if st is not None and st.kind is StreamKind.EDIT:
        st.window += inc
        if st.window > h2.MAX_WINDOW:
            return False, 0, h2.Violation(h2.FLOW_CONTROL_ERROR, f"stream {sid} window above 2^31-1", stream_only=True)
        drain(conn)
        return st.task is None and not st.closed, 0, None
    return sid not in conn.hijacked, 0, None
