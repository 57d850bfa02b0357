"""No runtime: the connection answers kubelet as a tiny HTTP/2 server that fails every call, then closes."""

from __future__ import annotations

import asyncio

from runtimeproxy import h2frames as h2
from runtimeproxy.grpc_framing import GRPC_UNAVAILABLE, trailers
from runtimeproxy.relay_state import ConnectionState


class Refusal(ConnectionState):
    """What a `Connection` does when the runtime cannot be dialed."""

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
                out += trailers(sid, GRPC_UNAVAILABLE, self.refusing)
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
