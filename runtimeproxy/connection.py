"""The connection pump: frames from kubelet to the runtime and back, read in place and written in runs.

See runtimeproxy/relay.py for what the relay does to the frames and why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from runtimeproxy import h2frames as h2
from runtimeproxy.calls import StreamKind
from runtimeproxy.grpc_framing import GRPC_CANCELLED, GRPC_INTERNAL, GRPC_UNAVAILABLE, GRPC_UNKNOWN, trailers
from runtimeproxy.held_calls import HeldCalls
from runtimeproxy.hpack_codec import Header, HeaderDecoder, HPACKError
from runtimeproxy.refusal import Refusal
from runtimeproxy.relay_state import MAX_HELD_BYTES, Stream

if TYPE_CHECKING:
    from runtimeproxy.relay import Relay

log = logging.getLogger(__name__)


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


class Connection(HeldCalls, Refusal):
    """One kubelet connection and the runtime connection paired with it."""

    def __init__(self, relay: Relay, client: asyncio.Transport) -> None:
        super().__init__(relay, client)
        self.dial_task = asyncio.get_running_loop().create_task(self._dial())

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
                out += trailers(st.sid, GRPC_UNAVAILABLE, message)
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
        st = Stream(sid=sid, path=path, kind=kind, t0=time.perf_counter())
        if sid > self.last_sid:
            self.last_sid = sid
        self.streams[sid] = st
        if kind is StreamKind.EDIT:
            st.window = self.b_initial_window
            if flags & h2.END_STREAM:
                self._start_edit(st)

    def _client_cancelled(self, st: Stream) -> None:
        self._abandon(st)
        self.handler.finished(st.path, st.kind, None, GRPC_CANCELLED, time.perf_counter() - st.t0)

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
