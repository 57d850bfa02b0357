"""What the relay keeps per connection and per stream, and the teardown that drops it."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtimeproxy import h2frames as h2
from runtimeproxy.calls import StreamKind
from runtimeproxy.hpack_codec import HeaderDecoder

if TYPE_CHECKING:
    from runtimeproxy.relay import Relay

#: The most the relay holds of one intercepted request: kubelet's message limit and the gRPC prefix.
MAX_HELD_BYTES = 16 * 1024 * 1024 + 5


@dataclass
class Stream:
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


class ConnectionState:
    """The state of one kubelet connection and its runtime connection; `Connection` adds the behaviour."""

    def __init__(self, relay: Relay, client: asyncio.Transport) -> None:
        self.relay = relay
        self.handler = relay.handler
        self.client = client
        self.backend: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
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
        self.blocked: list[Stream] = []
        # calls the runtime finished in the buffer being relayed, reported once it was written on
        self.done: list[tuple[bytes, StreamKind, bytes | None, int, float]] = []
        self.last_sid = 0
        self.closing = False
        self.refusing: str | None = None
        relay.connections.add(self)
        self.dial_task: asyncio.Task[None] | None = None

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
