"""The relay's state core: what it keeps per connection and per stream, and the teardown that drops it.

Everything above it in the relay (flow control, header sync, held calls,
refusal, draining, peer errors, the pump) reads and changes this state; this
module imports none of them, only the leaf codecs (`calls`, `h2frames`,
`hpack_codec`), and does no I/O but write and close on the transports it is
given. The records are mutable on purpose: they change with every frame.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtimeproxy import h2frames as h2
from runtimeproxy.calls import CallHandler, StreamKind
from runtimeproxy.hpack_codec import (
    Header,
    HeaderDecoder,
    TableEncoder,
    encode_size_updates,
    encode_unindexed,
)

#: The most the relay holds of one intercepted request: kubelet's message limit and the gRPC prefix.
MAX_HELD_BYTES = 16 * 1024 * 1024 + 5
#: How many refused or reset streams a connection remembers, to drop the frames still in flight on them.
DROPPED_MEMORY = 1024
#: What one read from a socket may take: asyncio's own default for a plain Protocol. The relay reads
#: into a buffer of this size that it keeps (`ReadBuffer`): a plain Protocol's `recv(256 KiB)` allocates
#: that much on every read, and unless glibc's mmap threshold happens to have grown past it, that is an
#: mmap, mremap and munmap per read (~8 us here, about what the relay's Python costs for a whole read).
READ_SIZE = 256 * 1024

#: Opens a connection to the runtime; raises OSError when it cannot.
Dialer = Callable[[Callable[[], asyncio.BaseProtocol]], Awaitable[asyncio.Transport]]


class Transport(Protocol):
    """What the relay uses of an asyncio transport."""

    def write(self, data: bytes | bytearray | memoryview) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class ReadBuffer:
    """The buffer one socket is read into; each read's bytes are copied out (the pumps keep slices of them)."""

    __slots__ = ("_buf", "_view")

    def __init__(self) -> None:
        self._buf = bytearray(READ_SIZE)
        self._view = memoryview(self._buf)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def take(self, nbytes: int) -> bytes:
        return bytes(self._view[:nbytes])


class CorkedTransport:
    """A transport whose writes, while corked, are collected and go out as one write when uncorked.

    A pump pass corks both sides (`ConnectionState.cork`): the runs it forwards and the frames the
    relay adds go to each peer in one `send()` per pass instead of one per cut in the run. Each
    `send()` wakes the peer, and on a busy node every wake-up is a chance to wait for a CPU. Writes
    outside a pass (a held call's edited message, draining, refusals) go out at once.
    """

    __slots__ = ("_pending", "transport")

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._pending: list[bytes | bytearray | memoryview] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._pending is None:
            self.transport.write(data)
        else:
            self._pending.append(data)

    def cork(self) -> None:
        if self._pending is None:
            self._pending = []

    def uncork(self) -> None:
        pending, self._pending = self._pending, None
        if pending:
            self.transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.uncork()
        self.transport.close()

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)


class RelayContext(Protocol):
    """What a connection needs of the relay that accepted it."""

    handler: CallHandler
    backend_name: str
    dial: Dialer
    connections: set[ConnectionState]

    def on_backend_connect(self, ok: bool) -> None: ...


class Side(enum.Enum):
    """Which peer a frame came from."""

    CLIENT = "kubelet"
    BACKEND = "runtime"


class Drain(enum.Enum):
    """How far a connection is in a graceful shutdown (RFC 9113 §6.8: GOAWAY, PING, GOAWAY)."""

    NONE = enum.auto()
    #: asked to drain before the runtime's SETTINGS reached kubelet: nothing may precede them
    REQUESTED = enum.auto()
    #: GOAWAY(2^31-1) and a PING sent; the final GOAWAY waits for the PING's ACK
    PINGED = enum.auto()
    #: final GOAWAY sent; the connection closes once its open calls are done
    FINAL = enum.auto()


@dataclass
class Stream:
    sid: int
    path: bytes
    kind: StreamKind
    t0: float
    body: bytearray = field(default_factory=bytearray)
    #: grpc-encoding of the request (OBSERVE, EDIT), to read a compressed message
    encoding: bytes = b""
    # bytes of flow-controlled DATA kubelet sent on this stream (held back for EDIT)
    received: int = 0
    # EDIT: bytes over the cap, when kubelet sent more than any message may be
    oversized: bool = False
    # EDIT: the runtime's stream-level send window, and what still waits for it
    window: int = 0
    pending: memoryview | None = None
    #: EDIT: the trailers kubelet ended the request with, sent after the edited message (which then lacks END_STREAM)
    trailers: Sequence[Header] | None = None
    task: asyncio.Task[None] | None = None
    # EDIT: the edited message was handed to the send path (its credit is withheld from kubelet)
    settled: bool = False
    #: the runtime's response headers went to kubelet: trailers the proxy writes must not repeat them
    responded: bool = False
    closed: bool = False


@dataclass
class HeaderPath:
    """One direction's header blocks: the sender's table as decoded, and the receiver's if they parted ways."""

    decoder: HeaderDecoder = field(default_factory=HeaderDecoder)
    #: set once a dropped block changed the sender's table: later blocks are re-encoded for the receiver
    reencoder: TableEncoder | None = None

    def own_block(self, sid: int, fields: Sequence[Header]) -> bytes:
        """Frames of a block the relay writes itself, ending the stream, that leave the receiver's table alone.

        Literals without indexing change no table and refer to none, so the block fits anywhere between the
        sender's. A size update the sender owes the receiver (which lowered SETTINGS_HEADER_TABLE_SIZE) starts
        it: the receiver expects one at the start of the first block after its SETTINGS were acknowledged.
        Once the receiver's table is the relay's, the relay's encoder writes the block, its pending updates first.
        """
        updates = self.decoder.take_owed_updates()
        if self.reencoder is None:
            return h2.header_frames(sid, True, encode_size_updates(updates) + encode_unindexed(list(fields)))
        self.reencoder.resize(updates)
        return h2.header_frames(sid, True, self.reencoder.encode(fields))


class ConnectionState:
    """The state of one kubelet connection and its runtime connection."""

    def __init__(self, relay: RelayContext, client: Transport) -> None:
        self.relay = relay
        self.handler = relay.handler
        self.client = CorkedTransport(client)
        self.backend: CorkedTransport | None = None
        self.streams: dict[int, Stream] = {}
        #: streams whose runtime frames the relay drops: it answered kubelet itself, or reset the stream
        self.hijacked: dict[int, None] = {}
        #: streams whose kubelet frames the relay drops: refused while draining, never sent to the runtime
        self.refused: dict[int, None] = {}
        self.req = HeaderPath()
        self.resp = HeaderPath()
        # the last request block's fields and its :path, the last trailers' fields and their status: a
        # repeated block decodes to the same (cached, unchanging) list, so the pumps need not read it again
        self.last_request: tuple[Sequence[Header] | None, bytes] = (None, b"")
        self.last_trailers: tuple[Sequence[Header] | None, int] = (None, 0)
        self.cbuf = b""
        self.bbuf = b""
        self.preface_seen = False
        #: something from the runtime (its SETTINGS first) reached kubelet
        self.server_started = False
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
        #: kubelet's SETTINGS the runtime has not acknowledged yet: the HEADER_TABLE_SIZE of each (-1: none)
        self.c_table_sizes: deque[int] = deque()
        self.withhold = 0
        self.blocked: list[Stream] = []
        # the largest frame each side may send: the other's SETTINGS_MAX_FRAME_SIZE, the highest
        # announced (a peer may use a new value before its ACK is back)
        self.client_frame_limit = h2.DEFAULT_MAX_FRAME
        self.backend_frame_limit = h2.DEFAULT_MAX_FRAME
        # calls the runtime finished in the buffer being relayed, reported once it was written on
        self.done: list[tuple[bytes, StreamKind, bytes | None, int, float]] = []
        #: the highest stream kubelet opened
        self.last_sid = 0
        self.drain = Drain.NONE
        self.drain_started = 0.0
        #: the last stream id of the relay's final GOAWAY: newer streams are refused
        self.goaway_sid: int | None = None
        #: the last stream id of the runtime's GOAWAY (passed on to kubelet): streams above it were never run
        self.runtime_goaway_sid: int | None = None
        self.closing = False
        self.refusing: str | None = None
        relay.connections.add(self)
        self.dial_task: asyncio.Task[None] | None = None

    def goaway_last_sid(self) -> int:
        """The last stream id for a GOAWAY to kubelet: never more than one it got before (RFC 9113 §6.8)."""
        last = self.last_sid
        if self.goaway_sid is not None:
            last = min(last, self.goaway_sid)
        if self.runtime_goaway_sid is not None:
            last = min(last, self.runtime_goaway_sid)
        return last

    def set_backend(self, transport: Transport) -> None:
        self.backend = CorkedTransport(transport)

    def cork(self) -> None:
        """Collects what the relay writes to either peer until `uncork` (one pump pass)."""
        self.client.cork()
        if self.backend is not None:
            self.backend.cork()

    def uncork(self) -> None:
        self.client.uncork()
        if self.backend is not None:
            self.backend.uncork()

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


def remember(dropped: dict[int, None], sid: int) -> None:
    """Adds a stream to a bounded set of streams whose late frames are dropped."""
    dropped[sid] = None
    if len(dropped) > DROPPED_MEMORY:
        del dropped[next(iter(dropped))]
