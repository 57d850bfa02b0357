"""Independent HTTP/2 peers: python-hyper's `h2` state machine on blocking unix sockets.

A `Peer` is one end of one connection: kubelet in front of the proxy
(`client_side=True`) or the container runtime behind it. It records, in order,
every frame it received (`frames`, split by their own length field, before h2
sees them), every h2 event (`events`), and the protocol error h2 raised on
receiving (`error`, after which h2 has queued its GOAWAY and the peer stops
writing, as a real endpoint closes after a connection error).

Nothing here comes from the relay under test: frames are built by h2, by
`frame()` below, or by rewriting what h2 serialised (`rewrite`), which keeps
h2's own state (HPACK, windows, streams) in step with what went on the wire.

GOAWAY frames are recorded in `goaways` and, while `hold_goaway` is set, kept
from h2: h2 turns its whole connection to CLOSED on a GOAWAY and would then
refuse the responses of streams the GOAWAY lets finish.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import select
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from hyperframe.frame import ContinuationFrame, Frame, HeadersFrame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# RFC 9113 frame types, flags and error codes, spelled out here so that nothing is shared with the relay
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535

E = TypeVar("E", bound=h2.events.Event)
_pings = itertools.count(1)


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"", *, length: int | None = None) -> bytes:
    """One frame as bytes; `length` overrides the length field (malformed frames)."""
    n = len(payload) if length is None else length
    return n.to_bytes(3, "big") + bytes((ftype, flags)) + stream_id.to_bytes(4, "big") + payload


@dataclass(frozen=True)
class RawFrame:
    type: int
    flags: int
    stream_id: int
    payload: bytes

    @property
    def error_code(self) -> int:
        """RST_STREAM's code, or GOAWAY's."""
        if self.type == GOAWAY:
            return int.from_bytes(self.payload[4:8], "big")
        return int.from_bytes(self.payload[:4], "big")

    @property
    def last_stream_id(self) -> int:
        return int.from_bytes(self.payload[:4], "big") & 0x7FFFFFFF


def split(data: bytes) -> list[RawFrame]:
    """Whole frames of `data`, each by its own length field."""
    out = []
    pos = 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos : pos + 3], "big")
        end = pos + 9 + length
        out.append(RawFrame(data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF,
                            bytes(data[pos + 9 : end])))
        pos = end
    assert pos == len(data), "a partial frame"
    return out


class Credit(enum.Enum):
    """How a peer returns flow-control credit for the DATA it receives."""

    #: every byte at once, stream and connection (what the window checks assume)
    PROMPT = enum.auto()
    #: h2's own policy (acknowledge_received_data: an update once half the window is used), like grpc-go
    LAZY = enum.auto()
    #: never
    NONE = enum.auto()


class Peer:
    """One HTTP/2 endpoint on one connected socket."""

    def __init__(self, sock: socket.socket, *, client_side: bool, name: str, credit: Credit = Credit.PROMPT) -> None:
        self.sock = sock
        self.name = name
        self.client_side = client_side
        self.credit = credit
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=client_side, header_encoding=None)
        )
        self.events: list[h2.events.Event] = []
        self.frames: list[RawFrame] = []
        self.goaways: list[RawFrame] = []
        #: header blocks this peer sent, per stream (grpcwire.request fills it)
        self.sent_headers: dict[int, list[tuple[bytes, bytes]]] = {}
        self.hold_goaway = True
        self.error: h2.exceptions.ProtocolError | None = None
        self.eof = False
        self.write_closed = False
        self._rbuf = bytearray()
        self._preface_left = 0 if client_side else len(PREFACE)
        sock.settimeout(10)

    # --- sending -----------------------------------------------------------------------------------

    def flush(self, rewrite: Callable[[list[Frame]], list[Frame]] | None = None) -> None:
        """Writes what h2 queued; `rewrite` may change the frames first (padding, priority, splitting)."""
        data = self.conn.data_to_send()
        if rewrite is not None and data:
            data = _rewrite(data, rewrite)
        self.send_raw(data)

    def send_raw(self, data: bytes) -> None:
        if not data or self.write_closed:
            return
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.write_closed = True

    def close_write(self) -> None:
        if not self.write_closed:
            self.write_closed = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Closes the socket; the peer reads nothing more (a runtime that went away)."""
        self.write_closed = True
        self.eof = True
        self.sock.close()

    # --- receiving ---------------------------------------------------------------------------------

    def read(self) -> None:
        """Reads what the socket has (it was readable) and processes it."""
        try:
            data = self.sock.recv(1 << 20)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return
        self.feed(data)

    def feed(self, data: bytes) -> None:
        if self._preface_left:
            take = data[: self._preface_left]
            self._preface_left -= len(take)
            self._h2_receive(take)
            data = data[len(take) :]
        self._rbuf += data
        while len(self._rbuf) >= 9:
            length = int.from_bytes(self._rbuf[:3], "big")
            if len(self._rbuf) < 9 + length:
                break
            raw = bytes(self._rbuf[: 9 + length])
            del self._rbuf[: 9 + length]
            f = split(raw)[0]
            self.frames.append(f)
            if f.type == GOAWAY and len(f.payload) >= 8:
                self.goaways.append(f)
                if self.hold_goaway:
                    continue
            self._h2_receive(raw)
        self.flush()

    def _h2_receive(self, raw: bytes) -> None:
        if self.error is not None:
            return
        try:
            events = self.conn.receive_data(raw)
        except h2.exceptions.ProtocolError as exc:
            self.error = exc
            self.flush()  # h2's GOAWAY
            self.close_write()
            return
        for ev in events:
            self.events.append(ev)
            if isinstance(ev, h2.events.DataReceived) and ev.flow_controlled_length:
                self._credit(ev)

    def _credit(self, ev: h2.events.DataReceived) -> None:
        n = ev.flow_controlled_length
        assert ev.stream_id is not None
        if self.credit is Credit.LAZY:
            self.conn.acknowledge_received_data(n, ev.stream_id)
        elif self.credit is Credit.PROMPT:
            self.conn.increment_flow_control_window(n)
            if ev.stream_ended is None and ev.stream_id in self.conn.streams and self.conn.streams[ev.stream_id].open:
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    self.conn.increment_flow_control_window(n, ev.stream_id)

    def return_connection_credit(self) -> None:
        """Gives the peer back all connection-level credit held back so far (no stream credit)."""
        owed = self.conn._inbound_flow_control_window_manager  # h2 keeps no public handle on it
        if owed.max_window_size > owed.current_window_size:
            self.conn.increment_flow_control_window(owed.max_window_size - owed.current_window_size)
        self.flush()

    def settle_credit(self) -> None:
        """Returns all credit held back so far (connection and open streams) and from now on credits at once."""
        self.credit = Credit.PROMPT
        self.return_connection_credit()
        for sid, stream in list(self.conn.streams.items()):
            mgr = stream._inbound_window_manager
            if stream.open and mgr.max_window_size > mgr.current_window_size:
                self.conn.increment_flow_control_window(mgr.max_window_size - mgr.current_window_size, sid)
        self.flush()

    # --- what it saw -------------------------------------------------------------------------------

    def of(self, kind: type[E], stream_id: int | None = None) -> list[E]:
        return [e for e in self.events if isinstance(e, kind) and (stream_id is None or getattr(e, "stream_id", None) == stream_id)]

    def frames_of(self, ftype: int, stream_id: int | None = None) -> list[RawFrame]:
        return [f for f in self.frames if f.type == ftype and (stream_id is None or f.stream_id == stream_id)]

    def body(self, stream_id: int) -> bytes:
        return b"".join(e.data or b"" for e in self.of(h2.events.DataReceived, stream_id))

    def ended(self, stream_id: int) -> bool:
        return bool(self.of(h2.events.StreamEnded, stream_id) or self.of(h2.events.StreamReset, stream_id))

    def reset(self, stream_id: int) -> h2.events.StreamReset | None:
        found = self.of(h2.events.StreamReset, stream_id)
        return found[0] if found else None

    def headers(self, stream_id: int) -> list[list[tuple[bytes, bytes]]]:
        """Every header block received on the stream, in order (request/response, then trailers)."""
        kinds = (h2.events.RequestReceived, h2.events.ResponseReceived, h2.events.TrailersReceived)
        return [list(e.headers or ()) for e in self.events if isinstance(e, kinds) and e.stream_id == stream_id]

    @property
    def dead(self) -> bool:
        """The connection is over for this peer: EOF, or a connection error (a GOAWAY received may still
        let streams finish)."""
        return self.eof or self.error is not None

    def describe(self) -> str:
        kinds = [type(e).__name__ + (f"({getattr(e, 'stream_id', '')})" if getattr(e, "stream_id", None) else "")
                 for e in self.events[-20:]]
        return f"{self.name}: eof={self.eof} error={self.error!r} goaways={self.goaways} last events={kinds}"


def _rewrite(data: bytes, rewrite: Callable[[list[Frame]], list[Frame]]) -> bytes:
    frames: list[Frame] = []
    pos = 0
    while pos < len(data):
        f, length = Frame.parse_frame_header(memoryview(data[pos : pos + 9]))
        f.parse_body(memoryview(data[pos + 9 : pos + 9 + length]))
        frames.append(f)
        pos += 9 + length
    return b"".join(f.serialize() for f in rewrite(frames))


# --- frame rewrites ---------------------------------------------------------------------------------


def pad_headers(pad_length: int, *, priority: bool = False) -> Callable[[list[Frame]], list[Frame]]:
    """HEADERS frames get `pad_length` bytes of padding (and a PRIORITY block if asked); the block is unchanged."""

    def rewrite(frames: list[Frame]) -> list[Frame]:
        for f in frames:
            if isinstance(f, HeadersFrame):
                f.flags.add("PADDED")
                f.pad_length = pad_length
                if priority:
                    f.flags.add("PRIORITY")
                    f.depends_on, f.stream_weight, f.exclusive = 0, 200, False
        return frames

    return rewrite


def split_headers(pieces: int) -> Callable[[list[Frame]], list[Frame]]:
    """Each header block goes out as HEADERS + CONTINUATION frames, `pieces` frames in all."""

    def rewrite(frames: list[Frame]) -> list[Frame]:
        out: list[Frame] = []
        for f in frames:
            if not isinstance(f, HeadersFrame) or "END_HEADERS" not in f.flags:
                out.append(f)
                continue
            block = f.data
            step = max(1, -(-len(block) // pieces))
            chunks = [block[i : i + step] for i in range(0, len(block), step)] or [b""]
            f.data = chunks[0]
            f.flags.discard("END_HEADERS")
            out.append(f)
            for i, chunk in enumerate(chunks[1:], start=1):
                c = ContinuationFrame(f.stream_id, data=chunk)
                if i == len(chunks) - 1:
                    c.flags.add("END_HEADERS")
                out.append(c)
            if len(chunks) == 1:
                f.flags.add("END_HEADERS")
        return out

    return rewrite


# --- driving several peers from one thread ----------------------------------------------------------


class WaitTimeout(AssertionError):
    pass


def pump(peers: Sequence[Peer], until: Callable[[], Any], *, timeout: float = 3.0, what: str = "") -> None:
    """Reads from every peer's socket (each reacting as h2 does) until `until()` is true."""
    deadline = time.monotonic() + timeout
    while not until():
        remaining = deadline - time.monotonic()
        live = [p for p in peers if not p.eof]
        if remaining <= 0 or not live:
            state = "\n".join(p.describe() for p in peers)
            raise WaitTimeout(f"waited {timeout}s for {what or until}:\n{state}")
        readable, _, _ = select.select([p.sock for p in live], [], [], min(remaining, 0.02))
        for p in live:
            if p.sock in readable:
                p.read()


def settle(peers: Sequence[Peer], seconds: float) -> None:
    """Reads for `seconds` whatever arrives (to show that something does not)."""
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        live = [p for p in peers if not p.eof]
        if remaining <= 0 or not live:
            return
        readable, _, _ = select.select([p.sock for p in live], [], [], remaining)
        for p in live:
            if p.sock in readable:
                p.read()


def ping_through(sender: Peer, receiver: Peer, *, timeout: float = 3.0) -> bool:
    """A PING round trip from `sender`: afterwards everything either sent before it has arrived.

    False when the connection ended first."""
    if sender.dead or receiver.dead:
        return False
    token = next(_pings).to_bytes(8, "big")
    sender.conn.ping(token)
    sender.flush()

    def acked() -> bool:
        return any(e.ping_data == token for e in sender.of(h2.events.PingAckReceived))

    try:
        pump([sender, receiver], lambda: acked() or sender.dead or receiver.dead, timeout=timeout, what="PING ack")
    except WaitTimeout:
        return False
    return acked()


def barrier(client: Peer, runtime: Peer) -> bool:
    """Both directions drained: the client's frames reached the runtime and the runtime's the client."""
    return ping_through(client, runtime) and ping_through(runtime, client)


def settings_acked(peer: Peer, count: int = 1) -> Callable[[], bool]:
    return lambda: len(peer.of(h2.events.SettingsAcknowledged)) >= count


def any_of(*conds: Callable[[], Any]) -> Callable[[], bool]:
    return lambda: any(c() for c in conds)


def all_peers(*groups: Iterable[Peer]) -> list[Peer]:
    return [p for g in groups for p in g]


@dataclass
class Pair:
    """One kubelet connection through the proxy and the runtime connection the proxy opened for it."""

    client: Peer
    runtime: Peer
    peers: list[Peer] = field(init=False)

    def __post_init__(self) -> None:
        self.peers = [self.client, self.runtime]

    def pump(self, until: Callable[[], Any], *, timeout: float = 3.0, what: str = "") -> None:
        pump(self.peers, until, timeout=timeout, what=what)

    def settle(self, seconds: float = 0.2) -> None:
        settle(self.peers, seconds)

    def barrier(self) -> bool:
        return barrier(self.client, self.runtime)

    def close(self) -> None:
        for p in self.peers:
            p.close()
