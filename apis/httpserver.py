"""A small HTTP/1.1 server in which every resource a client can hold is bounded.

It serves the kube-scheduler extender and the scheduler's probe/metrics listener,
and the agent's and the descheduler's metrics (apis/metrics_server.py).
`http.server.ThreadingHTTPServer` gives every connection a thread of its own,
reads with no deadline and believes Content-Length, so a client that connects
and sends nothing, sends its headers a byte at a time (slowloris) or announces
a negative length holds a thread forever. Here instead:

- One thread (the loop) accepts and reads every connection without blocking,
  through a selector. A connection costs a socket and a buffer, never a
  thread, until its request has fully arrived; idle keep-alive connections
  cost no thread either.
- A request (with TLS, the handshake too) must arrive whole within
  `request_timeout_s` of its first byte (of the connection, for the first
  request); else the client gets 408 and the connection is closed. An idle
  keep-alive connection is closed after `idle_timeout_s`.
- The head is at most `max_header_bytes` (else 431), the body at most
  `max_body_bytes` (else 413, before any of it is read) and announced by a
  Content-Length of plain digits (else 400); a chunked body gets 411, since
  kube-scheduler always sends a length.
- At most `max_connections` are open. One more closes the open connection that
  has waited longest without a complete request (idle or slow, or slow to read
  its answer), so a flood of idle connections cannot lock kube-scheduler out.
  With `max_connections_per_peer`, one address holds at most that many; one
  more from it is closed at once, so one client cannot crowd out the others.
- Complete requests go to `workers` threads through a queue of `queue_size`;
  when it is full the loop answers 503 at once. A worker only computes the
  answer: it never touches the socket.
- Requests the `inline` handler answers (tiny, non-blocking ones: health
  probes) are answered on the loop thread, with no worker and no queue, so
  busy or stuck workers cannot fail a liveness probe.
- The loop writes every answer, as fast as the client takes it: a client that
  reads slowly holds its socket and buffer, never a thread, and must take the
  whole answer within `write_timeout_s` of its start, or is disconnected.
- `stop(grace)` stops accepting and drops idle connections, and lets requests
  already taken finish and their answers be written, within the grace.

An error answer is followed by a "lingering close" (nginx's name): the server
stops writing and discards what the client still sends for a moment, so the
client reads the 4xx instead of a connection reset.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import http
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from apis import http1

log = logging.getLogger(__name__)

#: (method, path, body) -> (status, content type, body)
Handler = Callable[[str, str, bytes], tuple[int, str, bytes]]


@dataclass(frozen=True)
class Peer:
    """Who sent a request, for a handler that decides by it (`BoundedHTTPServer(peer_handler=...)`)."""

    address: str
    #: the verified client certificate's names (common names, then subject alternative names);
    #: () without TLS or when the client sent no certificate
    cert_names: tuple[str, ...] = ()


#: (method, path, body, peer) -> (status, content type, body)
PeerHandler = Callable[[str, str, bytes, Peer], tuple[int, str, bytes]]
#: (method, path) -> the answer, or None to give the request to a worker. Runs on the loop thread:
#: it must be quick and never block (no lock that a handler may hold, no I/O).
InlineHandler = Callable[[str, str], tuple[int, str, bytes] | None]

_READ_CHUNK = 64 * 1024
_WRITE_CHUNK = 256 * 1024
_LINGER_S = 1.0
_LINGER_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """What one client may hold; see the module docstring for what happens past each."""

    workers: int = 8
    queue_size: int = 64
    max_connections: int = 256
    #: connections one address may hold at once; 0: no limit of its own (only max_connections)
    max_connections_per_peer: int = 0
    request_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    write_timeout_s: float = 10.0
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 1024 * 1024


class _State(enum.Enum):
    HANDSHAKE = enum.auto()
    IDLE = enum.auto()  # between requests, nothing of the next one read yet
    READING = enum.auto()  # part of a request read
    BUSY = enum.auto()  # a worker is computing its answer
    WRITING = enum.auto()  # the loop is writing its answer
    LINGERING = enum.auto()  # answered with an error; discarding input until close


@dataclass(eq=False)
class _Conn:
    """One connection's mutable state; only the loop thread touches it (a worker gets the request alone)."""

    sock: socket.socket
    peer: str
    #: the peer's address without the port: what max_connections_per_peer counts
    host: str
    state: _State
    deadline: float
    #: when the current wait began: the oldest waiter is closed first when connections run out
    since: float
    buf: bytearray = field(default_factory=bytearray)
    continued: bool = False
    discarded: int = 0
    #: the answer being written, how much of it went out, and whether the connection stays open after it
    out: bytes = b""
    sent: int = 0
    keep: bool = False
    #: the client certificate's names, read at the connection's first request (a peer_handler's server)
    cert_names: tuple[str, ...] | None = None


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    body: bytes
    keep_alive: bool
    peer: Peer | None = None


class _Reject(Exception):
    """The request cannot be served: answer `status` with `message` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BoundedHTTPServer:
    """Serves `handler` on `host:port` (port 0: any free one), optionally with TLS."""

    def __init__(
        self,
        handler: Handler | None,
        *,
        host: str,
        port: int,
        name: str,
        limits: Limits = Limits(),
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
        inline: InlineHandler | None = None,
        peer_handler: PeerHandler | None = None,
    ) -> None:
        """`peer_handler` in place of `handler`: the handler also learns who sent each request (`Peer`)."""
        if (handler is None) == (peer_handler is None):
            raise ValueError(f"{name}: give one of handler and peer_handler")
        self._handler = handler
        self._peer_handler = peer_handler
        self._inline = inline
        self._limits = limits
        self._ssl = ssl_context
        self._name = name
        self._clock = clock
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, port), family=family, backlog=128)
        except OSError as exc:
            raise OSError(exc.errno, f"{name}: cannot listen on {host}:{port} ({exc.strerror}); is the port in use?") from None
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: set[_Conn] = set()
        self._per_peer: collections.Counter[str] = collections.Counter()
        #: answers from workers: (connection, response bytes, keep the connection open)
        self._returned: collections.deque[tuple[_Conn, bytes, bool]] = collections.deque()
        #: connections whose buffer may hold a further (pipelined) request, taken one per loop turn
        self._ready: collections.deque[_Conn] = collections.deque()
        self._work: queue.Queue[tuple[_Conn, _Request] | None] = queue.Queue(maxsize=limits.queue_size)
        self._stopping = threading.Event()
        self._stop_deadline = float("inf")
        self._shed = False
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) as bound."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self) -> None:
        loop = threading.Thread(target=self._loop, name=f"{self._name}-loop", daemon=True)
        workers = [
            threading.Thread(target=self._worker, name=f"{self._name}-worker-{i}", daemon=True)
            for i in range(self._limits.workers)
        ]
        self._threads = [loop, *workers]
        for thread in self._threads:
            thread.start()

    def stop(self, grace: float | None = None) -> None:
        """Stops accepting, closes waiting connections, lets requests in progress finish (and their answers
        be written) within `grace`."""
        deadline = None if grace is None else self._clock() + grace
        self._stop_deadline = float("inf") if deadline is None else deadline
        self._stopping.set()
        if not self._threads:  # never started
            self._close_all()
            return
        self._wake()
        # The loop goes first (it dispatches every request, then tells the workers to end); past the
        # grace, threads still running are daemon threads.
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - self._clock()))

    # --- the loop: accept, read, dispatch ------------------------------------------------

    def _loop(self) -> None:
        try:
            while not (self._stopping.is_set() and self._wound_down()):
                for key, _mask in self._selector.select(self._next_timeout()):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.data.state is _State.WRITING:
                        self._on_writable(key.data)
                    else:
                        self._on_readable(key.data)
                self._take_returned()
                self._take_ready()
                self._expire()
        except Exception:
            log.exception("%s: the connection loop failed", self._name)
        finally:
            self._close_all()
            # Put here, by the one thread that dispatches, each after every request: none is left unserved.
            for _ in range(self._limits.workers):
                try:
                    self._work.put_nowait(None)
                except queue.Full:  # only past the grace, with workers still busy: they are daemon threads
                    break

    def _wound_down(self) -> bool:
        """While stopping: stops listening and drops waiting connections (once); True when nothing is left
        to finish (no request with a worker, no answer being written) or the grace is over."""
        if not self._shed:
            self._shed = True
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self._listener)
            _close(self._listener)
            for conn in [c for c in self._conns if c.state not in (_State.BUSY, _State.WRITING)]:
                self._drop(conn)
        if self._clock() >= self._stop_deadline:
            return True
        return not any(c.state in (_State.BUSY, _State.WRITING) for c in self._conns) and not self._returned

    def _next_timeout(self) -> float:
        if self._ready or self._returned:
            return 0.0
        waiting = [c.deadline for c in self._conns if c.state is not _State.BUSY]
        if self._stopping.is_set():
            waiting.append(self._stop_deadline)
        if not waiting:
            return 1.0
        return max(0.0, min(1.0, min(waiting) - self._clock()))

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: the next select tries again
                log.warning("%s: accept failed: %s", self._name, exc)
                return
            host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            per_peer = self._limits.max_connections_per_peer
            if per_peer and self._per_peer[host] >= per_peer:
                log.debug("%s: %s holds %d connections already; closing one more", self._name, host, per_peer)
                _close(sock)
                continue
            if len(self._conns) >= self._limits.max_connections and not self._evict_oldest():
                _close(sock)  # every connection is being served: no room
                continue
            sock.setblocking(False)
            now = self._clock()
            state = _State.IDLE
            if self._ssl is not None:
                try:
                    sock = self._ssl.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    _close(sock)
                    continue
                state = _State.HANDSHAKE
            # The first request must come within the request timeout, not the idle one:
            # a client connects to send a request.
            conn = _Conn(
                sock=sock, peer=str(peer), host=host, state=state, deadline=now + self._limits.request_timeout_s, since=now
            )
            self._conns.add(conn)
            self._per_peer[host] += 1
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _evict_oldest(self) -> bool:
        waiting = [c for c in self._conns if c.state is not _State.BUSY]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.since)
        # Debug, not info: a flood of connections must not become a flood of log lines.
        log.debug("%s: %d connections open; closing the longest waiting, from %s", self._name, len(self._conns), oldest.peer)
        self._drop(oldest)
        return True

    def _on_readable(self, conn: _Conn) -> None:
        if conn.state is _State.HANDSHAKE:
            assert isinstance(conn.sock, ssl.SSLSocket)
            try:
                conn.sock.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (ssl.SSLError, OSError) as exc:
                log.debug("%s: TLS handshake with %s failed: %s", self._name, conn.peer, exc)
                self._drop(conn)
                return
            conn.state = _State.IDLE
        eof = self._read_available(conn)
        if conn.state is _State.LINGERING:
            if eof or conn.discarded > _LINGER_BYTES:
                self._drop(conn)
            return
        if eof:
            self._drop(conn)  # a client that leaves mid-request gets nothing: it is not listening
            return
        self._advance(conn)

    def _read_available(self, conn: _Conn) -> bool:
        """Reads what the socket has (TLS may hold more than one select says); True at end of stream."""
        limit = self._limits.max_header_bytes + self._limits.max_body_bytes
        while True:
            try:
                chunk = conn.sock.recv(_READ_CHUNK)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return False
            except OSError:
                return True
            if not chunk:
                return True
            if conn.state is _State.LINGERING:
                conn.discarded += len(chunk)
                if conn.discarded > _LINGER_BYTES:
                    return False
                continue
            if conn.state is _State.IDLE:
                now = self._clock()
                conn.state, conn.deadline, conn.since = _State.READING, now + self._limits.request_timeout_s, now
            conn.buf += chunk
            if len(conn.buf) > limit:
                return False  # more than any acceptable request: _advance rejects it

    def _advance(self, conn: _Conn) -> None:
        """Dispatches the request in `conn.buf` once it is complete; rejects it as soon as it cannot be."""
        try:
            request = self._parse(conn)
        except _Reject as reject:
            self._reject(conn, reject.status, str(reject))
            return
        if request is None:
            return
        if self._inline is not None:
            try:
                quick = self._inline(request.method, request.path)
            except Exception:
                log.exception("%s: %s %s failed", self._name, request.method, request.path)
                quick = 500, "text/plain", f"internal error; see {self._name}'s log".encode()
            if quick is not None:
                keep = request.keep_alive and not self._stopping.is_set()
                self._send(conn, _response(*quick, keep_alive=keep), keep=keep)
                return
        self._selector.unregister(conn.sock)
        conn.state = _State.BUSY
        try:
            self._work.put_nowait((conn, request))
        except queue.Full:
            conn.state = _State.READING
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            self._reject(conn, 503, f"{self._name}: busy ({self._limits.queue_size} requests waiting); retry")

    def _parse(self, conn: _Conn) -> _Request | None:
        limits = self._limits
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.buf) > limits.max_header_bytes:
                raise _Reject(431, f"request head over {limits.max_header_bytes} bytes")
            return None
        if end + 4 > limits.max_header_bytes:
            raise _Reject(431, f"request head over {limits.max_header_bytes} bytes")
        try:
            head = http1.parse_head(bytes(conn.buf[:end]), max_body_bytes=limits.max_body_bytes)
        except http1.HeadError as err:
            raise _Reject(err.status, str(err)) from None
        length = head.content_length
        total = end + 4 + length
        if len(conn.buf) < total:
            if head.expects_continue and not conn.continued:
                conn.continued = True
                _send_nowait(conn.sock, http1.CONTINUE)
            return None
        body = bytes(conn.buf[end + 4:total])
        del conn.buf[:total]
        conn.continued = False
        # The whole target, query included, as this server has always routed on it.
        # The certificate is read here, on the loop thread, which owns the socket; once per connection,
        # as it cannot change on it.
        peer = None
        if self._peer_handler is not None:
            if conn.cert_names is None:
                conn.cert_names = cert_names(conn.sock)
            peer = Peer(conn.peer, conn.cert_names)
        return _Request(method=head.method, path=head.target, body=body, keep_alive=head.keep_alive, peer=peer)

    def _reject(self, conn: _Conn, status: int, message: str) -> None:
        log.debug("%s: %s to %s: %s", self._name, status, conn.peer, message)
        _send_nowait(conn.sock, _response(status, "text/plain", message.encode(), keep_alive=False))
        self._linger(conn)

    def _linger(self, conn: _Conn) -> None:
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(conn)
            return
        conn.state, conn.buf = _State.LINGERING, bytearray()
        conn.deadline = self._clock() + _LINGER_S

    def _expire(self) -> None:
        now = self._clock()
        for conn in [c for c in self._conns if c.state is not _State.BUSY and c.deadline <= now]:
            if conn.state is _State.READING:
                self._reject(conn, 408, f"request not complete within {self._limits.request_timeout_s:g}s")
            else:
                self._drop(conn)

    def _take_returned(self) -> None:
        while self._returned:
            conn, data, keep = self._returned.popleft()
            if conn in self._conns:
                self._send(conn, data, keep=keep and not self._stopping.is_set())

    def _take_ready(self) -> None:
        """One further request of each connection that had more than one in its buffer (never recursively:
        a client pipelining thousands of probes gets one answer per loop turn)."""
        for _ in range(len(self._ready)):
            conn = self._ready.popleft()
            if conn in self._conns and conn.state is _State.READING:
                self._advance(conn)

    # --- writing answers, from the loop ------------------------------------------------

    def _send(self, conn: _Conn, data: bytes, *, keep: bool) -> None:
        """Writes `data` to `conn`: what the socket takes now, the rest as the client reads it."""
        now = self._clock()
        conn.state, conn.out, conn.sent, conn.keep = _State.WRITING, data, 0, keep
        conn.since, conn.deadline = now, now + self._limits.write_timeout_s
        self._watch(conn, selectors.EVENT_WRITE)
        self._on_writable(conn)

    def _on_writable(self, conn: _Conn) -> None:
        view = memoryview(conn.out)
        while conn.sent < len(view):
            try:
                conn.sent += conn.sock.send(view[conn.sent:conn.sent + _WRITE_CHUNK])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:  # TLS needs to read first; a readable socket brings us back here
                self._watch(conn, selectors.EVENT_READ)
                return
            except (OSError, ValueError) as exc:
                log.debug("%s: could not answer %s: %s", self._name, conn.peer, exc)
                self._drop(conn)
                return
        conn.out, conn.sent = b"", 0
        if not conn.keep or self._stopping.is_set():
            self._drop(conn)
            return
        now = self._clock()
        conn.state = _State.READING if conn.buf else _State.IDLE
        conn.since = now
        conn.deadline = now + (self._limits.request_timeout_s if conn.buf else self._limits.idle_timeout_s)
        self._watch(conn, selectors.EVENT_READ)
        if conn.buf:  # a pipelined request arrived with the last one
            self._ready.append(conn)

    def _watch(self, conn: _Conn, events: int) -> None:
        try:
            self._selector.modify(conn.sock, events, conn)
        except KeyError:
            self._selector.register(conn.sock, events, conn)

    def _drop(self, conn: _Conn) -> None:
        self._forget(conn)
        _close(conn.sock)

    def _forget(self, conn: _Conn) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            self._per_peer[conn.host] -= 1
            if self._per_peer[conn.host] <= 0:
                del self._per_peer[conn.host]
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)

    def _close_all(self) -> None:
        # Workers never touch sockets, so a connection whose request a worker still runs closes too.
        for conn in list(self._conns):
            self._drop(conn)
        for sock in (self._listener, self._wake_r, self._wake_w):
            _close(sock)
        with contextlib.suppress(OSError, RuntimeError):
            self._selector.close()

    def _wake(self) -> None:
        # Non-blocking: a full pipe means a wake-up is pending already; a closed one, the loop is gone.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: drained
            while self._wake_r.recv(4096):
                pass

    # --- workers: run the handler; the loop writes the answer -------------------------------

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            conn, request = item
            data, keep = self._serve(request)
            self._returned.append((conn, data, keep))
            self._wake()

    def _serve(self, request: _Request) -> tuple[bytes, bool]:
        """Runs the handler: (the response, whether the connection stays open after it)."""
        try:
            if self._peer_handler is not None and request.peer is not None:
                status, content_type, body = self._peer_handler(request.method, request.path, request.body, request.peer)
            else:
                assert self._handler is not None
                status, content_type, body = self._handler(request.method, request.path, request.body)
        except Exception:
            log.exception("%s: %s %s failed", self._name, request.method, request.path)
            status, content_type, body = 500, "text/plain", f"internal error; see {self._name}'s log".encode()
        keep = request.keep_alive and not self._stopping.is_set()
        return _response(status, content_type, body, keep_alive=keep), keep


#: GETs only, few at a time: probes and scrapes every few seconds (kubelet from the node's address,
#: Prometheus from its pod's, `kubectl fgpu top`), each with a connection or two.
SCRAPE_LIMITS = Limits(workers=2, queue_size=16, max_connections=64, max_connections_per_peer=8, max_body_bytes=4096)


class ServesHTTP:
    """A daemon's listener built on a `BoundedHTTPServer` (`self._http`): its address, start and stop."""

    _http: BoundedHTTPServer

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) as bound."""
        return self._http.address

    @property
    def port(self) -> int:
        return self._http.port

    def start(self) -> None:
        self._http.start()

    def stop(self, grace: float | None = None) -> None:
        self._http.stop(grace)


def cert_names(sock: socket.socket) -> tuple[str, ...]:
    """The names of the verified certificate the peer of `sock` presented: common names, then subject
    alternative names (DNS, IP, URI, email); () without TLS or certificate."""
    if not isinstance(sock, ssl.SSLSocket):
        return ()
    return peercert_names(sock.getpeercert() or {})


def peercert_names(cert: Mapping[str, Any]) -> tuple[str, ...]:
    """The names in a certificate as `ssl.SSLSocket.getpeercert()` gives it (see `cert_names`)."""
    found: list[str] = []
    for rdn in cert.get("subject", ()):
        found.extend(str(value) for key, value in rdn if key == "commonName")
    found.extend(value for _kind, value in cert.get("subjectAltName", ()) if isinstance(value, str))
    return tuple(found)


def _response(status: int, content_type: str, body: bytes, *, keep_alive: bool) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def _send_nowait(sock: socket.socket, data: bytes) -> None:
    """Best effort from the loop, which must never block: what does not fit in the buffer is lost."""
    with contextlib.suppress(OSError, ValueError):
        sock.send(data)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
