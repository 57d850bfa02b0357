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
rewrite the message, and sends the new message in their place. What keeps the
two connections consistent when it does:

- flow control (`flow_control`): the relay itself grants kubelet credit for
  the DATA it holds back, withholds from kubelet the connection credit the
  runtime returns for what the relay sent in its place, queues DATA while the
  runtime's window is short, and sends under new runtime SETTINGS only after
  kubelet's ACK of them went to the runtime;
- header tables (`header_sync`): a call the proxy refuses gets its trailers
  from the proxy (literal fields that change no table); a runtime block the
  relay then drops is still decoded, and if it changed the runtime's table,
  that direction is re-encoded from then on;
- header blocks are forwarded whole, so nothing the proxy injects can land
  between a HEADERS frame and its CONTINUATIONs.

This module is the listener: it accepts kubelet connections and, on
shutdown, drains them (`draining`) before it closes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import cast

from runtimeproxy import draining, peer_errors, request_pump
from runtimeproxy.calls import CallHandler
from runtimeproxy.connection import Connection
from runtimeproxy.logs import event
from runtimeproxy.relay_state import ConnectionState, Dialer, ReadBuffer

__all__ = ["Dialer", "Relay"]

log = logging.getLogger(__name__)

_STEP_S = 0.01


class Relay:
    """Accepts kubelet connections on a listener and relays each one to the runtime."""

    def __init__(
        self, *, dial: Dialer, handler: CallHandler, backend_name: str, on_backend_connect: Callable[[bool], None],
        on_backend_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self.dial = dial
        self.handler = handler
        self.backend_name = backend_name
        self._on_backend_connect = on_backend_connect
        self._on_backend_lost = on_backend_lost
        self.connections: set[ConnectionState] = set()

    def on_backend_connect(self, ok: bool) -> None:
        """A connection's dial of the runtime worked or (after its retries) failed."""
        self._on_backend_connect(ok)

    def on_backend_lost(self) -> None:
        """The runtime closed a connection the relay had not closed itself (restart, crash)."""
        self._on_backend_lost()

    def protocol(self) -> asyncio.BaseProtocol:
        return _ClientSide(self)

    async def shutdown(self, grace: float) -> None:
        """GOAWAY to every kubelet connection, their open calls finished (for up to `grace` s), then closed.

        Call it once the listener stopped accepting. Calls still open at the end get UNAVAILABLE.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        for conn in list(self.connections):
            draining.begin(conn, loop.time())
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(_STEP_S)
            now = loop.time()
            for conn in list(self.connections):
                draining.step(conn, now)
        cut: Counter[str] = Counter()
        for conn in list(self.connections):
            if conn.backend is not None:
                cut.update(st.path.decode(errors="replace") for st in conn.streams.values() if not st.closed)
                peer_errors.fail_open_calls(conn, "fgpu-runtime-proxy: shutting down before the runtime answered")
            conn.close()
        if cut:
            # kubelet saw these fail with UNAVAILABLE; the journal must say why, and which calls
            event(
                log, logging.WARNING, "grace ended; calls still open were ended with UNAVAILABLE",
                grace_s=grace, calls=sum(cut.values()), methods=",".join(f"{m}x{n}" for m, n in sorted(cut.items())),
            )


class _ClientSide(asyncio.BufferedProtocol):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.conn: Connection | None = None
        self._reads = ReadBuffer()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop transports are not subclasses
        self.conn = Connection(self.relay, transport, on_backend_lost=self.relay.on_backend_lost)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reads.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        assert self.conn is not None
        request_pump.pump(self.conn, self._reads.take(nbytes))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.client_lost()

    def pause_writing(self) -> None:
        if self.conn is not None and self.conn.backend is not None:
            self.conn.backend.pause_reading()

    def resume_writing(self) -> None:
        if self.conn is not None and self.conn.backend is not None:
            self.conn.backend.resume_reading()
