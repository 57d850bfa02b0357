"""An HTTP/1.1 server (TLS or plain) on one asyncio loop, in which every resource a client can hold is bounded.

The limits are the ones of the scheduler extender's server
(apis/httpserver.py), and the wire rules are shared (apis/http1.py);
the machinery differs. Each admission answer is a few tens of microseconds of
pure Python, so the handler runs inline on the loop: there is no hand-off
between an I/O thread and workers, which under the GIL cost that design a
third of its throughput and 60-100 us of CPU per request here
(bench/results/webhook.md). The loop runs in a thread of its own; `start()`
and `stop(grace)` are plain calls. TLS is started on the accepted TCP
transport (start_tls), so a connection can always be aborted, handshake or not.

- At most `max_connections` sockets are open, counting those still in their
  TLS handshake. One more closes the connection that has waited longest
  without a complete request (in its handshake, idle or slow); when every
  connection is busy, the new one is closed.
- The TLS handshake, and then each request, must arrive whole within
  `request_timeout_s` (of the accept, then of the request's first byte), else
  the connection is closed (the request answered 408). An idle keep-alive
  connection is closed after `idle_timeout_s`, longer than the API server's
  own 90 s so that the client, not the server, closes an idle connection
  (a POST on a connection the server just closed would fail).
- The head is at most `max_header_bytes` (else 431) and the body at most
  `max_body_bytes` (else 413, before any of it is read); the other wire rules
  are apis/http1.py's. Bodies being read take from one budget of
  `max_buffered_bytes` over all connections; past it, 503.
- A client must take its response within `write_timeout_s`; until it does,
  nothing more is read from it.
- After an error answer the server discards what the client still sends for a
  moment ("lingering close") so that the client reads the 4xx, not a reset.
- The handler must be quick and must not block: it runs on the loop. The body
  limit bounds its work. An exception in it is a 500, logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import socket
import ssl
import threading
import time
from asyncio import sslproto
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from apis import http1

log = logging.getLogger(__name__)

#: (method, path, body) -> (status, content type, body)
Handler = Callable[[str, str, bytes], tuple[int, str, bytes]]

# asyncio's TLS layer gives every connection a read buffer of SSLProtocol.max_size, 256 KiB: 50 MiB
# for 200 keep-alive connections. 32 KiB holds two whole TLS records, so an AdmissionReview still
# arrives in a pass or two; a connection then costs about 90 KiB in all (bench/results/webhook.md).
# Process-wide, which is the webhook's process alone.
sslproto.SSLProtocol.max_size = 32 * 1024

_LINGER_S = 1.0
_LINGER_BYTES = 1024 * 1024
_SWEEP_S = 0.25


@dataclass(frozen=True)
class Limits:
    """What one client may hold; see the module docstring for what happens past each."""

    #: The API servers' pools to one replica stay far below this (one connection per request in flight).
    max_connections: int = 512
    request_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0
    write_timeout_s: float = 10.0
    max_header_bytes: int = 16 * 1024
    #: The API server's own limit on a request body; a Pod it stores is smaller still.
    max_body_bytes: int = 3 * 1024 * 1024
    max_buffered_bytes: int = 256 * 1024 * 1024


class _State(enum.Enum):
    HANDSHAKE = enum.auto()
    IDLE = enum.auto()  # between requests
    READING = enum.auto()  # part of a request read
    LINGERING = enum.auto()  # answered with an error; discarding input until close
    CLOSED = enum.auto()


class AsyncHTTPServer:
    """Serves `handler` on `host:port` (port 0: any free one), with TLS when `ssl_context` is given."""

    def __init__(
        self,
        handler: Handler,
        *,
        host: str,
        port: int,
        name: str,
        limits: Limits = Limits(),
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.name = name
        self.clock = clock
        self._ssl = ssl_context
        self.tls = ssl_context is not None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, port), family=family, backlog=1024)
        except OSError as exc:
            raise OSError(exc.errno, f"{name}: cannot listen on {host}:{port} ({exc.strerror}); is the port in use?") from None
        self._listener.setblocking(False)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._conns: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting: asyncio.Task[None] | None = None
        self.buffered = 0
        self.stopping = False

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-loop", daemon=True)
        self._thread.start()

    def stop(self, grace: float | None = None) -> None:
        """Stops accepting, closes idle connections, gives requests being read `grace` seconds, then closes all."""
        if self._thread is None:
            self._listener.close()
            self._loop.close()
            return
        if self._loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._shutdown(grace), self._loop)
            with contextlib.suppress(Exception):
                future.result(None if grace is None else grace + 5.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        self._thread = None

    # --- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._accepting = self._spawn(self._accept_loop())
        self._loop.call_later(_SWEEP_S, self._sweep)
        try:
            self._loop.run_forever()
        finally:
            for conn in list(self._conns):
                conn.abort()
            for task in list(self._tasks):
                task.cancel()
            # Let the cancellations finish and the aborts' callbacks close their sockets (each takes a
            # turn or two of the loop), so that no transport outlives its loop.
            with contextlib.suppress(Exception):
                if self._tasks:
                    self._loop.run_until_complete(asyncio.wait(list(self._tasks), timeout=2.0))
                for _ in range(3):
                    self._loop.run_until_complete(asyncio.sleep(0))
            self._listener.close()
            self._loop.close()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept_loop(self) -> None:
        while not self.stopping:
            try:
                sock, peer = await self._loop.sock_accept(self._listener)
            except asyncio.CancelledError:
                raise
            except OSError as exc:  # e.g. EMFILE: wait a moment rather than spin
                log.warning("%s: accept failed: %s", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            if len(self._conns) >= self.limits.max_connections and not self._evict_oldest():
                with contextlib.suppress(OSError):
                    sock.close()  # every connection is being served: no room
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, peer=str(peer), now=self.clock())
            self._conns.add(conn)
            conn.task = self._spawn(self._connect(conn, sock))
            conn.task.add_done_callback(functools.partial(self._unstarted, conn, sock))

    async def _connect(self, conn: _Connection, sock: socket.socket) -> None:
        """The plain transport first, then TLS over it (start_tls), so that the connection always holds
        the TCP transport and can abort it, whatever state the handshake is in."""
        conn.started = True
        try:
            raw, _ = await self._loop.connect_accepted_socket(lambda: conn, sock)
            if self._ssl is not None:
                tls = await self._loop.start_tls(
                    raw, conn, self._ssl, server_side=True,
                    ssl_handshake_timeout=self.limits.request_timeout_s,
                    ssl_shutdown_timeout=self.limits.write_timeout_s,
                )
                assert tls is not None
                conn.tls_started(tls)
        except OSError as exc:  # SSLError, TimeoutError (the handshake timeout), ConnectionError
            log.debug("%s: TLS handshake with %s failed: %s", self.name, conn.peer, exc)
            conn.abort()
            with contextlib.suppress(OSError):
                sock.close()
        except asyncio.CancelledError:
            conn.abort()
            with contextlib.suppress(OSError):
                sock.close()
        finally:
            conn.task = None

    def _unstarted(self, conn: _Connection, sock: socket.socket, _task: asyncio.Task[None]) -> None:
        """A connection whose task was cancelled before it ran: its socket is still ours to close."""
        if not conn.started:
            self._forget(conn)
            with contextlib.suppress(OSError):
                sock.close()

    def _evict_oldest(self) -> bool:
        closing = [c for c in self._conns if c.state is _State.CLOSED]
        if closing:  # being closed already: abort one rather than a connection in use
            closing[0].abort()
            return True
        waiting = [c for c in self._conns if c.state in (_State.HANDSHAKE, _State.IDLE, _State.READING, _State.LINGERING)]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.since)
        log.debug("%s: %d connections open; closing the longest waiting, from %s", self.name, len(self._conns), oldest.peer)
        oldest.abort()
        return True

    def _sweep(self) -> None:
        now = self.clock()
        for conn in list(self._conns):
            conn.expire(now)
        if not self._loop.is_closed():
            self._loop.call_later(_SWEEP_S, self._sweep)

    def _forget(self, conn: _Connection) -> None:
        self._conns.discard(conn)

    async def _shutdown(self, grace: float | None) -> None:
        self.stopping = True
        if self._accepting is not None:
            self._accepting.cancel()  # before the listener closes under its pending accept
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        self._listener.close()
        for conn in list(self._conns):
            if conn.state in (_State.HANDSHAKE, _State.IDLE, _State.LINGERING):
                conn.abort()
        deadline = None if grace is None else self.clock() + grace
        while any(c.state is _State.READING or c.writing for c in self._conns):
            if deadline is not None and self.clock() >= deadline:
                break
            await asyncio.sleep(0.02)
        for conn in list(self._conns):
            conn.close()
        # Answers written last go out, TLS closes are exchanged; whatever is left is aborted by _run.
        end = self.clock() + 0.5
        while self._conns and self.clock() < end:
            await asyncio.sleep(0.02)


class _Connection(asyncio.Protocol):
    """One client connection: owned by the loop."""

    def __init__(self, server: AsyncHTTPServer, *, peer: str, now: float) -> None:
        self.server = server
        self.peer = peer
        self.state = _State.HANDSHAKE
        #: when the current wait began: the oldest waiter is closed first when connections run out
        self.since = now
        self.deadline = now + server.limits.request_timeout_s
        self.task: asyncio.Task[None] | None = None
        self.started = False  # the task began the handshake (and owns the socket)
        #: the TCP transport; `transport` is the one requests and answers go through (TLS over it, or it)
        self.raw: asyncio.Transport | None = None
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head: http1.RequestHead | None = None
        self.reserved = 0
        self.writing = False  # the client is not taking its response: reading is paused
        self.write_deadline = 0.0
        self.discarded = 0

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """The TCP connection (with TLS, start_tls follows: `tls_started`)."""
        assert isinstance(transport, asyncio.Transport)
        self.raw = transport
        if self.server.stopping or self.state is _State.CLOSED:
            transport.abort()
            return
        if self.server.tls:
            transport.pause_reading()  # the ClientHello is for start_tls, not for data_received
            return
        self._ready(transport)

    def tls_started(self, transport: asyncio.Transport) -> None:
        if self.state is _State.CLOSED:
            transport.abort()
            return
        self._ready(transport)

    def _ready(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.since = self.server.clock()
        # The first request must come within the request timeout, not the idle one.
        self.deadline = self.since + self.server.limits.request_timeout_s
        # A request sent right behind the handshake may be here already (data_received buffered it).
        self.state = _State.READING if self.buf else _State.IDLE
        self._advance()

    def data_received(self, data: bytes) -> None:
        if self.state is _State.LINGERING:
            self.discarded += len(data)
            if self.discarded > _LINGER_BYTES:
                self.close()
            return
        if self.state is _State.HANDSHAKE:  # TLS finished, but start_tls has not returned yet
            self.buf += data
            return
        if self.state is _State.IDLE:
            now = self.server.clock()
            self.state, self.since, self.deadline = _State.READING, now, now + self.server.limits.request_timeout_s
        self.buf += data
        self._advance()

    def eof_received(self) -> bool | None:
        return None  # close: a client that leaves mid-request is not listening for the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = _State.CLOSED
        self._release()
        self.server._forget(self)

    def pause_writing(self) -> None:
        self.writing = True
        self.write_deadline = self.server.clock() + self.server.limits.write_timeout_s
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing = False
        if self.transport is not None and self.state is not _State.CLOSED:
            self.transport.resume_reading()
            self._advance()

    # --- requests ------------------------------------------------------------------------

    def _advance(self) -> None:
        """Answers each complete request in the buffer; rejects one as soon as it cannot be served."""
        limits = self.server.limits
        while not self.writing and self.state is _State.READING:
            if self.head is None:
                end = self.buf.find(http1.HEAD_END)
                if end < 0:
                    if len(self.buf) > limits.max_header_bytes:
                        self._reject(431, f"request head over {limits.max_header_bytes} bytes")
                    return
                if end + 4 > limits.max_header_bytes:
                    self._reject(431, f"request head over {limits.max_header_bytes} bytes")
                    return
                try:
                    head = http1.parse_head(bytes(self.buf[:end]), max_body_bytes=limits.max_body_bytes)
                except http1.HeadError as exc:
                    self._reject(exc.status, str(exc))
                    return
                del self.buf[:end + 4]
                if self.server.buffered + head.content_length > limits.max_buffered_bytes:
                    self._reject(503, f"{self.server.name}: busy (request bodies over {limits.max_buffered_bytes} bytes "
                                      "being read); retry")
                    return
                self.head, self.reserved = head, head.content_length
                self.server.buffered += head.content_length
                if head.expects_continue and len(self.buf) < head.content_length and self.transport is not None:
                    self.transport.write(http1.CONTINUE)
            head = self.head
            if len(self.buf) < head.content_length:
                return
            body = bytes(self.buf[:head.content_length])
            del self.buf[:head.content_length]
            self.head = None
            self._release()
            if not self._respond(head, body):
                return
            now = self.server.clock()
            if self.buf:  # a pipelined request arrived with the last one
                self.state, self.since, self.deadline = _State.READING, now, now + limits.request_timeout_s
            else:
                self.state, self.since, self.deadline = _State.IDLE, now, now + limits.idle_timeout_s

    def _respond(self, head: http1.RequestHead, body: bytes) -> bool:
        """Answers one request; False when the connection closes after it."""
        server = self.server
        try:
            status, content_type, out = server.handler(head.method, head.target, body)
        except Exception:
            log.exception("%s: %s %s failed", server.name, head.method, head.path)
            status, content_type, out = 500, "text/plain", f"internal error; see {server.name}'s log".encode()
        keep = head.keep_alive and not server.stopping
        if head.method == "HEAD":
            out = b""
        assert self.transport is not None
        self.transport.write(http1.response(status, content_type, out, keep_alive=keep))
        if not keep:
            self.close()
        return keep

    def _reject(self, status: int, message: str) -> None:
        log.debug("%s: %s to %s: %s", self.server.name, status, self.peer, message)
        self._release()
        self.head, self.buf = None, bytearray()
        assert self.transport is not None
        self.transport.write(http1.response(status, "text/plain; charset=utf-8", message.encode(), keep_alive=False))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.state, self.deadline = _State.LINGERING, self.server.clock() + _LINGER_S

    def _release(self) -> None:
        self.server.buffered -= self.reserved
        self.reserved = 0

    # --- limits in time --------------------------------------------------------------------

    def expire(self, now: float) -> None:
        if self.state is _State.CLOSED:
            if now >= self.deadline:
                self.abort()  # a TLS close the client never completed
            return
        if self.writing and now >= self.write_deadline:
            log.debug("%s: %s did not take its response within %gs", self.server.name, self.peer,
                      self.server.limits.write_timeout_s)
            self.abort()
        elif self.writing or now < self.deadline:
            return
        elif self.state is _State.READING:
            self._reject(408, f"request not complete within {self.server.limits.request_timeout_s:g}s")
        else:
            self.close()  # handshake, idle or lingering: its time is up

    def close(self) -> None:
        """Closes after what is written has gone out (and, with TLS, the close is exchanged).

        The connection counts until it is gone (connection_lost), and is aborted if
        that takes longer than the write timeout.
        """
        if self.state is _State.CLOSED:
            return
        if self.transport is not None:
            self.transport.close()
        elif self.raw is not None:
            self.raw.abort()  # mid-handshake: nothing to flush
        elif self.task is not None:
            self.task.cancel()
        self.state = _State.CLOSED
        self.deadline = self.server.clock() + self.server.limits.write_timeout_s
        self._release()

    def abort(self) -> None:
        """Closes now, dropping what is unsent."""
        if self.raw is not None:
            self.raw.abort()  # with TLS over it, that goes too
        elif self.task is not None:
            self.task.cancel()
        self.state = _State.CLOSED
        self._release()
        self.server._forget(self)
