"""The CRI relay: HTTP/2 frames from kubelet to containerd and back, mostly untouched.

Each kubelet connection gets its own connection to the runtime, and frames go
through byte for byte: settings, pings, flow control, header blocks (so
metadata, deadlines via `grpc-timeout`, status codes and details all pass),
and calls to methods the proxy has never heard of. Nothing is deserialised
on the way through, which is what keeps the added latency low (see
docs/runtime-proxy.md for the measurements that led here).

The relay still reads every header block, in both directions, because HPACK's
dynamic table is shared state and the relay needs `:path` (to pick the calls
it intercepts) and `grpc-status` (metrics, post-call hooks). For an
intercepted call it holds the request's DATA frames back, lets the handler
rewrite the message, and sends the new message in their place. Three things
keep the two connections consistent when it does:

- flow control: the relay itself grants kubelet credit for the DATA it holds
  back (stream and connection level, or kubelet would stall on a message
  larger than the window), then withholds from kubelet the connection credit
  the runtime returns for what the relay sent in its place, and queues DATA
  while the runtime's window is short;
- a call the proxy refuses gets its trailers from the proxy (literal header
  fields without indexing, which leave kubelet's HPACK table untouched) and
  the runtime's half of the stream is reset;
- header blocks are forwarded whole, so nothing the proxy injects can land
  between a HEADERS frame and its CONTINUATIONs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from runtimeproxy import h2frames as h2
from runtimeproxy.calls import CallHandler, Forward, Refuse, StreamKind
from runtimeproxy.hpack_codec import Header, HeaderDecoder, HPACKError, encode_unindexed, percent_encode

log = logging.getLogger(__name__)

GRPC_OK = 0
GRPC_CANCELLED = 1
GRPC_UNKNOWN = 2
GRPC_INTERNAL = 13
GRPC_UNAVAILABLE = 14
GRPC_UNIMPLEMENTED = 12
GRPC_RESOURCE_EXHAUSTED = 8

#: The most the relay holds of one intercepted request: kubelet's message limit and the gRPC prefix.
MAX_HELD_BYTES = 16 * 1024 * 1024 + 5

_HIJACKED_MEMORY = 1024

#: Opens a connection to the runtime; raises OSError when it cannot.
Dialer = Callable[[Callable[[], asyncio.Protocol]], Awaitable[asyncio.Transport]]


@dataclass
class _Stream:
    sid: int
    path: bytes
    kind: StreamKind
    t0: float
    body: bytearray = field(default_factory=bytearray)
    # bytes of flow-controlled DATA kubelet sent on this stream (held back for EDIT)
    received: int = 0
    # EDIT: bytes over the cap, when kubelet sent more than any message may be
    oversized: bool = False
    # EDIT: the runtime's stream-level send window, and what still waits for it
    window: int = 0
    pending: memoryview | None = None
    task: asyncio.Task[None] | None = None
    # EDIT: the edited message was handed to the send path (its credit is withheld from kubelet)
    settled: bool = False
    closed: bool = False


class Relay:
    """Accepts kubelet connections on a listener and relays each one to the runtime."""

    def __init__(
        self, *, dial: Dialer, handler: CallHandler, backend_name: str, on_backend_connect: Callable[[bool], None]
    ) -> None:
        self.dial = dial
        self.handler = handler
        self.backend_name = backend_name
        self.on_backend_connect = on_backend_connect
        self.connections: set[Connection] = set()

    def protocol(self) -> asyncio.Protocol:
        return _ClientSide(self)

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()

    @property
    def open_calls(self) -> int:
        return sum(len(c.streams) for c in self.connections)


class _ClientSide(asyncio.Protocol):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop transports are not subclasses
        self.conn = Connection(self.relay, transport)

    def data_received(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.client_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.client_lost()

    def pause_writing(self) -> None:
        if self.conn is not None and self.conn.backend is not None:
            self.conn.backend.pause_reading()

    def resume_writing(self) -> None:
        if self.conn is not None and self.conn.backend is not None:
            self.conn.backend.resume_reading()


class _BackendSide(asyncio.Protocol):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        self.conn.backend_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.backend_lost(exc)

    def pause_writing(self) -> None:
        self.conn.client.pause_reading()

    def resume_writing(self) -> None:
        self.conn.client.resume_reading()


class Connection:
    """One kubelet connection and the runtime connection paired with it."""

    def __init__(self, relay: Relay, client: asyncio.Transport) -> None:
        self.relay = relay
        self.handler = relay.handler
        self.client = client
        self.backend: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.hijacked: dict[int, None] = {}
        self.req_headers = HeaderDecoder()
        self.resp_headers = HeaderDecoder()
        self.cbuf = b""
        self.bbuf = b""
        self.preface_seen = False
        # a header block being collected (raw frames, fragments, stream, flags), per direction
        self.c_block: tuple[bytearray, bytearray, int, int] | None = None
        self.b_block: tuple[bytearray, bytearray, int, int] | None = None
        # flow control toward the runtime
        self.bwin = h2.DEFAULT_WINDOW
        self.b_initial_window = h2.DEFAULT_WINDOW
        self.b_max_frame = h2.DEFAULT_MAX_FRAME
        self.queue: deque[tuple[bytes, int]] = deque()
        # runtime SETTINGS kubelet has not acknowledged yet (in order)
        self.b_settings: deque[dict[int, int]] = deque()
        self.withhold = 0
        self.blocked: list[_Stream] = []
        # calls the runtime finished in the buffer being relayed, reported once it was written on
        self.done: list[tuple[bytes, StreamKind, bytes | None, int, float]] = []
        self.last_sid = 0
        self.closing = False
        self.refusing: str | None = None
        relay.connections.add(self)
        self.dial_task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(self._dial())

    # --- lifecycle --------------------------------------------------------------------------------

    async def _dial(self) -> None:
        try:
            transport = await self.relay.dial(lambda: _BackendSide(self))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.relay.on_backend_connect(False)
            log.warning("backend unreachable backend=%s error=%r", self.relay.backend_name, str(exc))
            self._refuse_all(f"fgpu-runtime-proxy: the container runtime at {self.relay.backend_name} is unreachable: {exc}")
            return
        finally:
            self.dial_task = None
        self.relay.on_backend_connect(True)
        if self.closing:
            transport.close()
            return
        self.backend = transport
        if self.cbuf:
            data, self.cbuf = self.cbuf, b""
            self.client_data(data)

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.relay.connections.discard(self)
        if self.dial_task is not None:
            self.dial_task.cancel()
        for st in self.streams.values():
            st.closed = True
            if st.task is not None:
                st.task.cancel()
        self.streams.clear()
        self.client.close()
        if self.backend is not None:
            self.backend.close()

    def client_lost(self) -> None:
        self.close()

    def backend_lost(self, exc: Exception | None) -> None:
        if self.closing:
            return
        # The runtime went away (restart, crash): finish kubelet's open calls with a clear
        # status and let it reconnect; the next connection dials the runtime afresh.
        message = f"fgpu-runtime-proxy: lost the connection to the container runtime at {self.relay.backend_name}"
        out = bytearray()
        for st in self.streams.values():
            if not st.closed:
                out += self._trailers(st.sid, GRPC_UNAVAILABLE, message)
        out += h2.goaway(self.last_sid, h2.NO_ERROR)
        self.client.write(bytes(out))
        self.close()

    # --- kubelet -> runtime -----------------------------------------------------------------------

    def client_data(self, data: bytes) -> None:
        if self.closing:
            return
        if self.backend is None:
            self.cbuf += data
            if self.refusing is not None:
                self._refuse_pending()
            return
        buf = self.cbuf + data if self.cbuf else data
        n = len(buf)
        pos = 0
        if not self.preface_seen:
            if n < len(h2.PREFACE):
                self.cbuf = buf
                return
            if buf[: len(h2.PREFACE)] != h2.PREFACE:
                log.warning("client sent no HTTP/2 preface; closing")
                self.close()
                return
            self.preface_seen = True
            pos = len(h2.PREFACE)
        out_start = 0
        backend = self.backend
        streams = self.streams
        while n - pos >= 9:
            length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            end = pos + 9 + length
            if end > n:
                break
            ftype = buf[pos + 3]
            flags = buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            if ftype == h2.DATA:
                st = streams.get(sid)
                if st is not None and st.kind is StreamKind.EDIT:
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
                        self.client.write(credit)
                    if flags & h2.END_STREAM:
                        self._start_edit(st)
                else:
                    if st is not None and st.kind is StreamKind.OBSERVE:
                        st.body += h2.unpad(flags, buf[pos + 9 : end])
                    if self.queue or self.bwin < length:
                        if out_start < pos:
                            backend.write(buf[out_start:pos])
                        out_start = end
                        self.queue.append((buf[pos:end], length))
                    else:
                        self.bwin -= length
            elif ftype == h2.HEADERS:
                fragment = h2.header_block_fragment(flags, buf[pos + 9 : end])
                if flags & h2.END_HEADERS:
                    self._request_headers(sid, self._decode(self.req_headers, fragment), flags)
                else:
                    if out_start < pos:
                        backend.write(buf[out_start:pos])
                    out_start = end
                    self.c_block = (bytearray(buf[pos:end]), bytearray(fragment), sid, flags)
            elif ftype == h2.CONTINUATION and self.c_block is not None:
                if out_start < pos:
                    backend.write(buf[out_start:pos])
                out_start = end
                raw, fragment_buf, bsid, bflags = self.c_block
                raw += buf[pos:end]
                fragment_buf += buf[pos + 9 : end]
                if flags & h2.END_HEADERS:
                    self.c_block = None
                    backend.write(bytes(raw))
                    self._request_headers(bsid, self._decode(self.req_headers, fragment_buf), bflags)
            elif ftype == h2.RST_STREAM:
                st = streams.pop(sid, None)
                if st is not None:
                    self._client_cancelled(st)
            elif ftype == h2.SETTINGS and flags & h2.ACK and self.b_settings:
                # the runtime enforces its new settings once kubelet acknowledged them, and so does the relay
                self._backend_settings(self.b_settings.popleft())
            pos = end
        if out_start == 0 and pos == n:
            backend.write(buf)
        elif out_start < pos:
            backend.write(buf[out_start:pos])
        self.cbuf = buf[pos:] if pos < n else b""

    def _decode(self, decoder: HeaderDecoder, fragment: bytes | bytearray | memoryview) -> Sequence[Header]:
        try:
            return decoder.decode(fragment)
        except HPACKError as exc:
            # Past a bad block the shared table is unknown: nothing after it can be trusted.
            log.error("undecodable header block; closing connection error=%r", str(exc))
            self.close()
            return []

    def _request_headers(self, sid: int, headers: Sequence[Header], flags: int) -> None:
        if self.closing:
            return
        st = self.streams.get(sid)
        if st is not None:  # trailers from the client; gRPC clients send none, but be correct
            if flags & h2.END_STREAM and st.kind is StreamKind.EDIT:
                self._start_edit(st)
            return
        path = b""
        for name, value in headers:
            if name == b":path":
                path = value
                break
        kind = self.handler.classify(path)
        st = _Stream(sid=sid, path=path, kind=kind, t0=time.perf_counter())
        if sid > self.last_sid:
            self.last_sid = sid
        self.streams[sid] = st
        if kind is StreamKind.EDIT:
            st.window = self.b_initial_window
            if flags & h2.END_STREAM:
                self._start_edit(st)

    def _client_cancelled(self, st: _Stream) -> None:
        self._abandon(st)
        self.handler.finished(st.path, st.kind, None, GRPC_CANCELLED, time.perf_counter() - st.t0)

    def _abandon(self, st: _Stream) -> None:
        """The call ended before its held-back request fully reached the runtime: stop, settle credit."""
        st.closed = True
        if st.kind is not StreamKind.EDIT:
            return
        if st.task is not None and not st.task.done():
            st.task.cancel()
        if st.settled and st.pending is not None:
            # never sent, so the runtime will not return credit for it: stop withholding that much
            self.withhold = max(0, self.withhold - len(st.pending))
        st.pending = None
        if st in self.blocked:
            self.blocked.remove(st)

    # --- intercepted calls --------------------------------------------------------------------------

    def _start_edit(self, st: _Stream) -> None:
        if st.task is None and not st.closed:
            st.task = asyncio.get_running_loop().create_task(self._edit(st))

    async def _edit(self, st: _Stream) -> None:
        body = bytes(st.body)
        message: bytes | Refuse = _grpc_message(body)
        if st.oversized:
            message = Refuse(GRPC_RESOURCE_EXHAUSTED, f"fgpu-runtime-proxy: request larger than {MAX_HELD_BYTES} bytes")
        outcome: Forward | Refuse
        if isinstance(message, Refuse):
            outcome = message
        else:
            try:
                outcome = await self.handler.edit(st.path, message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("intercepting %s failed", st.path.decode(errors="replace"))
                outcome = Refuse(GRPC_INTERNAL, f"fgpu-runtime-proxy: intercepting {st.path.decode(errors='replace')} failed: {exc}")
        if st.closed or self.closing or self.backend is None:
            return
        if isinstance(outcome, Refuse):
            self._hijack(st, outcome)
            return
        payload = body if outcome.message is None else _grpc_frame(outcome.message)
        st.settled = True
        # kubelet was credited when the relay took its bytes; what the runtime returns for these is not kubelet's
        self.withhold += len(payload)
        st.pending = memoryview(payload)
        self._send_pending(st)
        if st.pending is not None:
            self.blocked.append(st)

    def _send_pending(self, st: _Stream) -> None:
        assert self.backend is not None
        pending = st.pending
        if pending is None:
            return
        if not pending:
            self.backend.write(h2.frame(h2.DATA, h2.END_STREAM, st.sid))
            st.pending = None
            return
        out = bytearray()
        while pending and not self.queue:
            n = min(len(pending), st.window, self.bwin, self.b_max_frame)
            if n <= 0:
                break
            chunk = pending[:n]
            pending = pending[n:]
            st.window -= n
            self.bwin -= n
            out += h2.frame(h2.DATA, 0 if pending else h2.END_STREAM, st.sid, bytes(chunk))
        if out:
            self.backend.write(bytes(out))
        st.pending = pending if pending else None

    def _hijack(self, st: _Stream, refusal: Refuse) -> None:
        assert self.backend is not None
        self.streams.pop(st.sid, None)
        self._abandon(st)
        self.hijacked[st.sid] = None
        if len(self.hijacked) > _HIJACKED_MEMORY:
            del self.hijacked[next(iter(self.hijacked))]
        self.backend.write(h2.rst_stream(st.sid, h2.CANCEL))
        self.client.write(self._trailers(st.sid, refusal.code, refusal.message))
        self.handler.finished(st.path, st.kind, bytes(st.body[5:]), refusal.code, time.perf_counter() - st.t0)

    def _trailers(self, sid: int, code: int, message: str, *, headers_sent: bool = False) -> bytes:
        fields: list[Header] = []
        if not headers_sent:
            fields += [(b":status", b"200"), (b"content-type", b"application/grpc")]
        fields += [(b"grpc-status", str(code).encode()), (b"grpc-message", percent_encode(message))]
        return h2.frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, sid, encode_unindexed(fields))

    # --- runtime -> kubelet -----------------------------------------------------------------------

    def backend_data(self, data: bytes) -> None:
        if self.closing:
            return
        buf = self.bbuf + data if self.bbuf else data
        n = len(buf)
        pos = 0
        out_start = 0
        client = self.client
        while n - pos >= 9:
            length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
            end = pos + 9 + length
            if end > n:
                break
            ftype = buf[pos + 3]
            flags = buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            if ftype == h2.DATA:
                if sid in self.hijacked:
                    if out_start < pos:
                        client.write(buf[out_start:pos])
                    out_start = end
                    if length:
                        self._backend_write(h2.window_update(0, length))
                elif flags & h2.END_STREAM:
                    self._response_end(sid, None)
            elif ftype == h2.HEADERS:
                fragment = h2.header_block_fragment(flags, buf[pos + 9 : end])
                if flags & h2.END_HEADERS:
                    headers = self._decode(self.resp_headers, fragment)
                    if sid in self.hijacked:
                        if out_start < pos:
                            client.write(buf[out_start:pos])
                        out_start = end
                    elif flags & h2.END_STREAM:
                        self._response_end(sid, headers)
                else:
                    if out_start < pos:
                        client.write(buf[out_start:pos])
                    out_start = end
                    self.b_block = (bytearray(buf[pos:end]), bytearray(fragment), sid, flags)
            elif ftype == h2.CONTINUATION and self.b_block is not None:
                if out_start < pos:
                    client.write(buf[out_start:pos])
                out_start = end
                raw, fragment_buf, bsid, bflags = self.b_block
                raw += buf[pos:end]
                fragment_buf += buf[pos + 9 : end]
                if flags & h2.END_HEADERS:
                    self.b_block = None
                    headers = self._decode(self.resp_headers, fragment_buf)
                    if bsid not in self.hijacked:
                        client.write(bytes(raw))
                        if bflags & h2.END_STREAM:
                            self._response_end(bsid, headers)
            elif ftype == h2.WINDOW_UPDATE:
                inc = int.from_bytes(buf[pos + 9 : pos + 13], "big") & 0x7FFFFFFF
                if sid == 0:
                    self.bwin += inc
                    if self.withhold:
                        if out_start < pos:
                            client.write(buf[out_start:pos])
                        out_start = end
                        kept = min(self.withhold, inc)
                        self.withhold -= kept
                        if inc > kept:
                            client.write(h2.window_update(0, inc - kept))
                    self._drain()
                else:
                    st = self.streams.get(sid)
                    edit = st is not None and st.kind is StreamKind.EDIT
                    if edit or sid in self.hijacked:
                        # kubelet had its stream credit from the relay already
                        if out_start < pos:
                            client.write(buf[out_start:pos])
                        out_start = end
                    if st is not None and edit:
                        st.window += inc
                        self._drain()
            elif ftype == h2.SETTINGS:
                if not flags & h2.ACK:
                    self.b_settings.append(h2.parse_settings(buf[pos + 9 : end]))
            elif ftype == h2.RST_STREAM:
                if sid in self.hijacked:
                    if out_start < pos:
                        client.write(buf[out_start:pos])
                    out_start = end
                    del self.hijacked[sid]
                else:
                    code = int.from_bytes(buf[pos + 9 : pos + 13], "big")
                    self._response_end(sid, None, rst_code=code)
            pos = end
        if out_start == 0 and pos == n:
            client.write(buf)
        elif out_start < pos:
            client.write(buf[out_start:pos])
        self.bbuf = buf[pos:] if pos < n else b""
        if self.done:
            self._report_done()

    def _report_done(self) -> None:
        done, self.done = self.done, []
        finished = self.handler.finished
        for path, kind, message, code, seconds in done:
            finished(path, kind, message, code, seconds)

    def _backend_write(self, data: bytes) -> None:
        if self.backend is not None:
            self.backend.write(data)

    def _backend_settings(self, values: dict[int, int]) -> None:
        if h2.SETTINGS_INITIAL_WINDOW_SIZE in values:
            new = values[h2.SETTINGS_INITIAL_WINDOW_SIZE]
            diff = new - self.b_initial_window
            self.b_initial_window = new
            # RFC 9113 moves open streams' windows by the difference, but a grpc-core runtime that
            # raised its initial window (BDP probing) was seen to reset, with PROTOCOL_ERROR, a
            # held-back stream that used the difference (test_relay.py, 4x5MB). Only a decrease is
            # applied; the runtime grants more with stream WINDOW_UPDATEs as it reads.
            if diff < 0:
                for st in self.streams.values():
                    if st.kind is StreamKind.EDIT:
                        st.window += diff
        if h2.SETTINGS_MAX_FRAME_SIZE in values:
            self.b_max_frame = values[h2.SETTINGS_MAX_FRAME_SIZE]
        self._drain()

    def _drain(self) -> None:
        if self.backend is None:
            return
        while self.queue and self.bwin >= self.queue[0][1]:
            frame_bytes, length = self.queue.popleft()
            self.bwin -= length
            self.backend.write(frame_bytes)
        if self.blocked and not self.queue:
            for st in list(self.blocked):
                self._send_pending(st)
                if st.pending is None:
                    self.blocked.remove(st)

    def _response_end(self, sid: int, headers: Sequence[Header] | None, *, rst_code: int | None = None) -> None:
        st = self.streams.pop(sid, None)
        if st is None:
            return
        if rst_code is not None:
            code = h2.RST_TO_GRPC.get(rst_code, GRPC_INTERNAL)
        else:
            code = GRPC_UNKNOWN
            for name, value in headers or ():
                if name == b"grpc-status":
                    try:
                        code = int(value)
                    except ValueError:
                        code = GRPC_UNKNOWN
                    break
        # an EDIT call the runtime answered before taking all of the held-back request
        # (e.g. Unimplemented): nothing more goes to it
        self._abandon(st)
        message = bytes(st.body[5:]) if st.kind is not StreamKind.PASS and len(st.body) >= 5 else None
        # metrics and post-call hooks wait until the response is on its way to kubelet
        self.done.append((st.path, st.kind, message, code, time.perf_counter() - st.t0))

    # --- no runtime -------------------------------------------------------------------------------

    def _refuse_all(self, reason: str) -> None:
        """Answers kubelet as a tiny HTTP/2 server that fails every call, then closes."""
        if self.closing:
            return
        self.refusing = reason
        self.client.write(h2.settings())
        self._refuse_pending()
        loop = asyncio.get_running_loop()
        # give kubelet a moment to send the calls it already queued, so they get the reason
        loop.call_later(0.2, self._finish_refusing)

    def _refuse_pending(self) -> None:
        assert self.refusing is not None
        buf = self.cbuf
        pos = 0
        if not self.preface_seen:
            if len(buf) < len(h2.PREFACE):
                return
            self.preface_seen = True
            pos = len(h2.PREFACE)
        out = bytearray()
        while len(buf) - pos >= 9:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            end = pos + 9 + length
            if end > len(buf):
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            if ftype == h2.SETTINGS and not flags & h2.ACK:
                out += h2.settings_ack()
            elif ftype == h2.PING and not flags & h2.ACK:
                out += h2.frame(h2.PING, h2.ACK, 0, buf[pos + 9 : end])
            elif ftype == h2.HEADERS and sid not in self.hijacked:
                self.hijacked[sid] = None
                self.last_sid = max(self.last_sid, sid)
                out += self._trailers(sid, GRPC_UNAVAILABLE, self.refusing)
            elif ftype == h2.DATA and length:
                out += h2.window_update(0, length)
            pos = end
        self.cbuf = buf[pos:]
        if out:
            self.client.write(bytes(out))

    def _finish_refusing(self) -> None:
        if not self.closing:
            self.client.write(h2.goaway(self.last_sid, h2.NO_ERROR, b"container runtime unreachable"))
            self.close()


def _grpc_message(body: bytes) -> bytes | Refuse:
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


def _grpc_frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


async def dial_unix(path: str, factory: Callable[[], asyncio.Protocol]) -> asyncio.Transport:
    transport, _ = await asyncio.get_running_loop().create_unix_connection(factory, path)
    return transport

