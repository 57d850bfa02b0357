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

Modules: `relay` (listener), `connection` (the pump, both directions),
`relay_state` (per-connection and per-stream state), `flow_control`,
`held_calls` (intercepted calls), `refusal` (no runtime), `grpc_framing`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import cast

from runtimeproxy.calls import CallHandler
from runtimeproxy.connection import Connection
from runtimeproxy.relay_state import ConnectionState

#: Opens a connection to the runtime; raises OSError when it cannot.
Dialer = Callable[[Callable[[], asyncio.Protocol]], Awaitable[asyncio.Transport]]


class Relay:
    """Accepts kubelet connections on a listener and relays each one to the runtime."""

    def __init__(
        self, *, dial: Dialer, handler: CallHandler, backend_name: str, on_backend_connect: Callable[[bool], None]
    ) -> None:
        self.dial = dial
        self.handler = handler
        self.backend_name = backend_name
        self.on_backend_connect = on_backend_connect
        self.connections: set[ConnectionState] = set()

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

