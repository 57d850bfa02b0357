"""One HTTP/2 connection to a hook server, carrying unary gRPC calls from the proxy's event loop.

Why not grpc.aio: a grpc.aio call costs ~0.2 ms of CPU in grpcio's call
machinery and wakes grpcio's poller thread, which then wakes the event loop:
on a busy 2-core node each such hand-off is a chance to wait for a CPU, and
the hooked CreateContainer's p99 came from exactly those waits. The relay's
own codecs make a unary client small: requests go out as one HEADERS frame of
literal fields (no dynamic table on our side, so nothing to keep in step) and
DATA frames under the server's windows; answers are read by a `HeaderDecoder`
that follows the server's table, and every frame is checked as the relay checks
them (`h2frames.check`).

Behaviour, as grpcio's channel had it for these calls:

- a call's deadline goes to the server as `grpc-timeout`; the caller enforces
  it (`asyncio.timeout`), and a call given up on is reset (RST_STREAM CANCEL);
- the server's GOAWAY fails the calls above its last stream id as UNAVAILABLE
  and lets the others finish; the connection takes no new calls and the next
  call dials a new one (as does the next call after the connection is lost);
- a broken frame from the server ends the connection (GOAWAY with the RFC's
  code) and fails its calls; its other hook servers' connections are apart.

`CallFailed` carries the gRPC status a failed call ended with; `hookclient`
maps it (and timeouts) to `HookCallError`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import unquote

from runtimeproxy import grpc_framing
from runtimeproxy import h2frames as h2
from runtimeproxy.calls import Refuse
from runtimeproxy.grpc_framing import (
    GRPC_CANCELLED,
    GRPC_INTERNAL,
    GRPC_OK,
    GRPC_RESOURCE_EXHAUSTED,
    GRPC_UNAVAILABLE,
    GRPC_UNKNOWN,
)
from runtimeproxy.hpack_codec import Header, HeaderDecoder, HPACKError

log = logging.getLogger(__name__)

#: The largest answer taken: grpcio's limit on the proxy's hook channel (MAX_MESSAGE_BYTES) and the prefix.
MAX_ANSWER = grpc_framing.MAX_MESSAGE_BYTES + 5
#: Our receive window for a stream and for the connection: the largest answer fits, so the server
#: never waits for our credit within a call; the connection's is topped up as answers arrive.
RECEIVE_WINDOW = 17 * 1024 * 1024
_SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
_RST_CODES = {h2.REFUSED_STREAM: GRPC_UNAVAILABLE, h2.CANCEL: GRPC_CANCELLED}


class CallFailed(Exception):
    """A call that ended without an answer: its gRPC status code (a number; `hookclient` names it) and details."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


@dataclass(eq=False)
class _Call:
    sid: int
    answer: asyncio.Future[bytes]
    #: the server's window for this stream, and the request bytes still waiting for it
    window: int
    pending: memoryview
    body: bytearray = field(default_factory=bytearray)
    headers: list[Header] = field(default_factory=list)


class HookConnection(asyncio.Protocol):
    """A client HTTP/2 connection for unary gRPC calls; `call` many at once, `usable` says if it takes more."""

    def __init__(self, *, endpoint: str) -> None:
        self.endpoint = endpoint
        self._transport: asyncio.Transport | None = None
        self._calls: dict[int, _Call] = {}
        self._next_sid = 1
        self._decoder = HeaderDecoder()
        self._buf = b""
        #: a header block being collected across CONTINUATIONs: stream, flags, fragments
        self._block: tuple[int, int, bytearray] | None = None
        # the server's windows and limits toward it
        self._window = h2.DEFAULT_WINDOW
        self._initial_window = h2.DEFAULT_WINDOW
        self._max_frame = h2.DEFAULT_MAX_FRAME
        self._max_streams = h2.MAX_STREAM_ID
        #: DATA received on the connection and not yet credited back
        self._unacked = 0
        self._going_away = False
        self.closed = False

    # --- calls --------------------------------------------------------------------------------------

    def usable(self) -> bool:
        """Takes new calls: open, no GOAWAY from the server, stream ids left."""
        return not self.closed and not self._going_away and self._next_sid < h2.MAX_STREAM_ID - 2

    async def call(self, path: str, message: bytes, *, timeout_s: float) -> bytes:
        """The serialized answer of one unary call; CallFailed when it ends with another status."""
        if not self.usable() or self._transport is None:
            raise CallFailed(GRPC_UNAVAILABLE, "the connection to the hook server is closing")
        if len(self._calls) >= self._max_streams:
            raise CallFailed(GRPC_RESOURCE_EXHAUSTED,
                             f"the hook server allows {self._max_streams} concurrent calls")
        sid = self._next_sid
        self._next_sid += 2
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        call = _Call(sid, answer, self._initial_window, memoryview(grpc_framing.grpc_frame(message)))
        self._calls[sid] = call
        try:
            # HEADERS and what the windows allow of the DATA in one write: one wake-up of the server, not two
            self._send(call, h2.header_frames(sid, False, self._request_block(path, timeout_s)))
            return await answer
        finally:
            if self._calls.pop(sid, None) is not None and not self.closed:
                # given up on (deadline, cancelled): the server may stop working on it
                self._transport.write(h2.rst_stream(sid, h2.CANCEL))
            self._close_if_done()

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.write(h2.goaway(0, h2.NO_ERROR))
            self._transport.close()
        self._lost("the proxy closed the connection to the hook server")

    def _request_block(self, path: str, timeout_s: float) -> bytes:
        # :method POST and :scheme http from the static table, the rest literal without indexing
        millis = max(1, min(int(timeout_s * 1000), 99_999_999))
        return b"\x83\x86" + _literals((
            (b":path", path.encode()), (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
            (b"te", b"trailers"), (b"grpc-timeout", f"{millis}m".encode()),
        ))

    def _send(self, call: _Call, headers: bytes = b"") -> None:
        """Sends what the server's windows allow of a call's request (after `headers`); END_STREAM with its last byte."""
        assert self._transport is not None
        pending = call.pending
        out = bytearray(headers)
        while pending:
            n = min(len(pending), call.window, self._window, self._max_frame)
            if n <= 0:
                break
            call.window -= n
            self._window -= n
            out += h2.frame(h2.DATA, h2.END_STREAM if n == len(pending) else 0, call.sid, bytes(pending[:n]))
            pending = pending[n:]
        call.pending = pending
        if out:
            self._transport.write(bytes(out))

    def _resume(self) -> None:
        for call in list(self._calls.values()):
            if call.pending:
                self._send(call)

    def _finish(self, call: _Call, *, error: CallFailed | None = None) -> None:
        self._calls.pop(call.sid, None)
        if call.answer.done():
            return
        if error is not None:
            call.answer.set_exception(error)
            return
        status, details = _status(call.headers)
        if status != GRPC_OK:
            call.answer.set_exception(CallFailed(status, details))
            return
        encoding = next((value for name, value in call.headers if name == b"grpc-encoding"), b"")
        message = grpc_framing.grpc_message(bytes(call.body), encoding)
        if isinstance(message, Refuse):
            call.answer.set_exception(CallFailed(GRPC_INTERNAL, f"the hook's answer: {message.message}"))
            return
        call.answer.set_result(message)

    def _close_if_done(self) -> None:
        if self._going_away and not self._calls and not self.closed:
            self.close()

    # --- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop transports are not subclasses
        self._transport.write(
            h2.PREFACE
            + h2.settings({h2.SETTINGS_ENABLE_PUSH: 0, h2.SETTINGS_INITIAL_WINDOW_SIZE: RECEIVE_WINDOW})
            + h2.window_update(0, RECEIVE_WINDOW - h2.DEFAULT_WINDOW)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost("the hook server closed the connection" + (f": {exc}" if exc else ""))

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        while n - pos >= 9 and not self.closed:
            hi, lo, ftype, flags, sid = h2.unpack_header(buf, pos)
            length = hi << 16 | lo
            sid &= 0x7FFFFFFF
            if length > h2.DEFAULT_MAX_FRAME:  # we announce no larger SETTINGS_MAX_FRAME_SIZE
                self._connection_error(h2.oversized(length, h2.DEFAULT_MAX_FRAME))
                return
            end = pos + 9 + length
            if end > n:
                break
            self._frame(ftype, flags, sid, buf[pos + 9 : end])
            pos = end
        self._buf = buf[pos:]

    # --- frames -------------------------------------------------------------------------------------

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self._block is not None and ftype != h2.CONTINUATION:
            self._connection_error(h2.INTERRUPTED_BLOCK)
            return
        v = h2.check(ftype, flags, sid, payload, from_server=True)
        if v is not None:
            if not v.stream_only:
                self._connection_error(v)
                return
            self._stream_error(sid, v)
            return
        call = self._calls.get(sid) if sid else None
        if ftype == h2.DATA:
            self._unacked += len(payload)
            if self._unacked >= RECEIVE_WINDOW // 2:
                self._write(h2.window_update(0, self._unacked))
                self._unacked = 0
            if call is None:
                return
            call.body += h2.unpad(flags, payload)
            if len(call.body) > MAX_ANSWER:
                self._stream_error(sid, h2.Violation(h2.CANCEL, "answer too large", stream_only=True),
                                   CallFailed(GRPC_RESOURCE_EXHAUSTED,
                                              f"the hook's answer is larger than {MAX_ANSWER} bytes"))
            elif flags & h2.END_STREAM:
                self._finish(call, error=CallFailed(GRPC_INTERNAL, "the hook's answer ended without trailers"))
        elif ftype == h2.HEADERS:
            fragment = h2.header_block_fragment(flags, payload)
            if flags & h2.END_HEADERS:
                self._headers(sid, flags, fragment)
            else:
                self._block = (sid, flags, bytearray(fragment))
        elif ftype == h2.CONTINUATION:
            block = self._block
            if block is None or block[0] != sid:
                self._connection_error(h2.Violation(h2.PROTOCOL_ERROR, "CONTINUATION outside its header block"))
                return
            block[2].extend(payload)
            if len(block[2]) > h2.MAX_HEADER_BLOCK:
                self._connection_error(h2.Violation(h2.ENHANCE_YOUR_CALM, "header block too large"))
            elif flags & h2.END_HEADERS:
                self._block = None
                self._headers(sid, block[1], block[2])
        elif ftype == h2.SETTINGS:
            if not flags & h2.ACK:
                self._settings(h2.parse_settings(payload))
        elif ftype == h2.PING:
            if not flags & h2.ACK:
                self._write(h2.ping(payload, ack=True))
        elif ftype == h2.WINDOW_UPDATE:
            inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if sid == 0:
                self._window += inc
                if self._window > h2.MAX_WINDOW:
                    self._connection_error(h2.Violation(h2.FLOW_CONTROL_ERROR, "connection window above 2^31-1"))
                    return
                self._resume()
            elif call is not None:
                call.window += inc
                if call.window > h2.MAX_WINDOW:
                    self._stream_error(sid, h2.Violation(h2.FLOW_CONTROL_ERROR, "stream window above 2^31-1"))
                    return
                self._send(call)
        elif ftype == h2.RST_STREAM:
            if call is not None:
                code = int.from_bytes(payload, "big")
                status = _RST_CODES.get(code, GRPC_INTERNAL)
                self._finish(call, error=CallFailed(status, f"the hook server reset the call ({h2.ERROR_NAMES.get(code, hex(code))})"))
        elif ftype == h2.GOAWAY:
            last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            self._going_away = True
            for other in [c for s, c in self._calls.items() if s > last]:
                self._finish(other, error=CallFailed(GRPC_UNAVAILABLE, "the hook server is going away"))
            self._close_if_done()
        # PRIORITY and unknown frame types: nothing to do (PUSH_PROMISE fails `check`: push is off)

    def _headers(self, sid: int, flags: int, fragment: bytes | bytearray | memoryview) -> None:
        try:
            # decoded even for a call given up on: the server's table moves with every block
            headers = self._decoder.decode(fragment)
        except HPACKError as exc:
            self._connection_error(h2.Violation(h2.COMPRESSION_ERROR, f"bad header block: {exc}"))
            return
        call = self._calls.get(sid)
        if call is None:
            return
        call.headers.extend(headers)
        if flags & h2.END_STREAM:
            self._finish(call)

    def _settings(self, values: dict[int, int]) -> None:
        if h2.SETTINGS_INITIAL_WINDOW_SIZE in values:
            new = values[h2.SETTINGS_INITIAL_WINDOW_SIZE]
            delta, self._initial_window = new - self._initial_window, new
            # RFC 9113 §6.9.2: open streams' windows move by the difference
            for call in self._calls.values():
                call.window += delta
        if h2.SETTINGS_MAX_FRAME_SIZE in values:
            self._max_frame = values[h2.SETTINGS_MAX_FRAME_SIZE]
        if _SETTINGS_MAX_CONCURRENT_STREAMS in values:
            self._max_streams = values[_SETTINGS_MAX_CONCURRENT_STREAMS]
        self._write(h2.settings_ack())
        self._resume()

    # --- errors -------------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self.closed:
            self._transport.write(data)

    def _stream_error(self, sid: int, v: h2.Violation, error: CallFailed | None = None) -> None:
        self._write(h2.rst_stream(sid, v.code))
        call = self._calls.get(sid)
        if call is not None:
            self._finish(call, error=error or CallFailed(GRPC_INTERNAL, f"the hook server broke HTTP/2: {v.reason}"))

    def _connection_error(self, v: h2.Violation) -> None:
        log.warning("HTTP/2 connection error from hook server %s: %s (%s); closing", self.endpoint,
                    v.reason, v.code_name)
        if self._transport is not None and not self.closed:
            self._transport.write(h2.goaway(0, v.code, v.reason.encode()[:256]))
            self._transport.close()
        self._lost(f"the hook server broke HTTP/2: {v.reason} ({v.code_name})")

    def _lost(self, why: str) -> None:
        self.closed = True
        for call in list(self._calls.values()):
            self._finish(call, error=CallFailed(GRPC_UNAVAILABLE, why))


def _literals(fields: tuple[Header, ...]) -> bytes:
    out = bytearray()
    for name, value in fields:
        out += b"\x00"
        out += _length(len(name))
        out += name
        out += _length(len(value))
        out += value
    return bytes(out)


def _length(n: int) -> bytes:
    """An HPACK string length, 7-bit prefix, no Huffman."""
    if n < 0x7F:
        return bytes((n,))
    out = bytearray((0x7F,))
    n -= 0x7F
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _status(headers: list[Header]) -> tuple[int, str]:
    """The gRPC status of an answer's header blocks, as grpcio maps a missing or non-200 one."""
    http_status = b""
    status: bytes | None = None
    message = b""
    for name, value in headers:
        if name == b":status" and not http_status:
            http_status = value
        elif name == b"grpc-status":
            status = value
        elif name == b"grpc-message":
            message = value
    if status is None:
        if http_status and http_status != b"200":
            return GRPC_UNKNOWN, f"HTTP status {http_status.decode(errors='replace')} from the hook server"
        return GRPC_INTERNAL, "the hook's answer carried no grpc-status"
    try:
        code = int(status)
    except ValueError:
        code = GRPC_UNKNOWN
    return code, unquote(message.decode("ascii", errors="replace"))
