"""Graceful shutdown of one connection: GOAWAY, finish what is open, close (RFC 9113 §6.8).

kubelet is told twice. First GOAWAY with the largest stream id and a PING:
kubelet stops opening streams, and the ones already on their way are still
taken. When the PING's ACK is back (or after `PING_WAIT_S`), the final GOAWAY
names the last stream the relay forwarded; a stream kubelet opens after it
is refused (RST_STREAM REFUSED_STREAM) and never reaches the runtime, so
kubelet may retry it on its next connection without running it twice. The
connection closes once every call it forwarded has its answer written.
"""

from __future__ import annotations

from runtimeproxy import h2frames as h2
from runtimeproxy.relay_state import ConnectionState, Drain, remember

#: the payload of the relay's own PING; its ACK is the relay's, not the runtime's
DRAIN_PING = b"fgpu-drn"
PING_WAIT_S = 1.0
_MESSAGE = b"fgpu-runtime-proxy is shutting down"


def begin(conn: ConnectionState, now: float) -> None:
    """Starts draining (again, if it had to wait for the runtime's first frames)."""
    if conn.closing or conn.drain not in (Drain.NONE, Drain.REQUESTED) or conn.refusing is not None:
        return
    if conn.backend is None:
        # still dialling: nothing went to the runtime, so kubelet may send every stream elsewhere
        if conn.dial_task is not None:
            conn.dial_task.cancel()
        conn.goaway_sid = 0
        conn.client.write(h2.settings() + h2.goaway(0, h2.NO_ERROR, _MESSAGE))
        conn.close()
        return
    if not conn.server_started:
        # the runtime's SETTINGS must be the first frame kubelet sees
        conn.drain = Drain.REQUESTED
        return
    if conn.runtime_goaway_sid is not None:
        # kubelet has the runtime's GOAWAY already, and a GOAWAY's last stream id may only go down
        final(conn)
        return
    conn.drain = Drain.PINGED
    conn.drain_started = now
    conn.client.write(h2.goaway(h2.MAX_STREAM_ID, h2.NO_ERROR, _MESSAGE) + h2.ping(DRAIN_PING))


def ping_acked(conn: ConnectionState) -> None:
    if conn.drain is Drain.PINGED:
        final(conn)


def final(conn: ConnectionState) -> None:
    """The GOAWAY that counts: streams after the last one forwarded are refused."""
    conn.drain = Drain.FINAL
    conn.goaway_sid = conn.goaway_last_sid()
    conn.client.write(h2.goaway(conn.goaway_sid, h2.NO_ERROR, _MESSAGE))


def step(conn: ConnectionState, now: float) -> None:
    """Moves a draining connection on: the final GOAWAY when the PING is late, closing once idle."""
    if conn.closing:
        return
    if conn.drain in (Drain.NONE, Drain.REQUESTED):
        begin(conn, now)
    elif conn.drain is Drain.PINGED and now - conn.drain_started >= PING_WAIT_S:
        final(conn)
    if conn.drain is Drain.FINAL and not conn.streams:
        conn.close()


def refuse_stream(conn: ConnectionState, sid: int) -> None:
    """A stream opened after the final GOAWAY: kubelet hears it was not processed; the runtime never sees it."""
    remember(conn.refused, sid)
    conn.client.write(h2.rst_stream(sid, h2.REFUSED_STREAM))
