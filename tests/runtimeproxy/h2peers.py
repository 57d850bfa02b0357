"""Independent HTTP/2 ends for frame-level tests of the relay: kubelet and runtime, on the `h2` package.

    runtime = RuntimeListener(path)             # the proxy's backend; the proxy dials it per kubelet connection
    kubelet = Peer.connect(listen_path)         # an h2 client in front of the proxy
    rt = runtime.accept()
    sid = request(kubelet, "/test.Echo/Unary", b"hi")
    pump([kubelet, rt], lambda: rt.ended(sid))

Both ends run on the test's thread. Each keeps the raw frames it received
(`frames`) as well as feeding them to its h2 connection (`events`, `error`),
so a test checks what arrived on the wire and what a conforming peer made of
it. Frames h2 would refuse to send go out with `send_raw`.
"""

from __future__ import annotations

import contextlib
import enum
import os
import select
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from tests.runtimeproxy.kubelet import messages
from tests.runtimeproxy.rig import ProxyRig

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class RawFrame:
    ftype: int
    flags: int
    stream_id: int
    payload: bytes


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + stream_id.to_bytes(4, "big") + payload


def grpc_frame(message: bytes, flag: int = 0) -> bytes:
    return bytes((flag,)) + len(message).to_bytes(4, "big") + message


class Credit(enum.Enum):
    """How a peer returns flow-control credit for the DATA it receives."""

    AUTO = enum.auto()  # connection and stream, as h2 sees fit
    CONNECTION = enum.auto()  # connection only: the sender's stream window only moves by SETTINGS
    NONE = enum.auto()


class Peer:
    """One end of an HTTP/2 connection over a unix socket."""

    def __init__(self, sock: socket.socket, *, client: bool, name: str, settings: dict[int, int] | None = None) -> None:
        self.sock = sock
        self.name = name
        self.client = client
        config = h2.config.H2Configuration(client_side=client, header_encoding=None, validate_inbound_headers=False)
        self.conn = h2.connection.H2Connection(config=config)
        if settings:
            self.conn.local_settings = h2.settings.Settings(client=client, initial_values=settings)
            self.conn.max_inbound_frame_size = self.conn.local_settings.max_frame_size
        self.credit = Credit.AUTO
        self.events: list[h2.events.Event] = []
        self.frames: list[RawFrame] = []
        self.error: Exception | None = None
        self.eof = False
        self._raw = b""
        self._preface_left = 0 if client else len(PREFACE)  # a server end reads the client preface first
        self.conn.initiate_connection()
        self.flush()

    @classmethod
    def connect(cls, path: str, *, name: str = "kubelet") -> Peer:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        return cls(sock, client=True, name=name)

    # --- I/O ---------------------------------------------------------------------------------------

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.eof:
            # the other end may have closed; what it sent before is still there to read
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.sock.sendall(data)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self.eof = True
            return
        data = self._parse(data)
        if self.error is not None or not data:
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.H2Error as exc:  # h2 also queues its own GOAWAY
            self.error = exc
            self.flush()
            return
        self.events += events
        for event in events:
            if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                self._credit(event)
        self.flush()

    def _credit(self, event: h2.events.DataReceived) -> None:
        if self.credit is Credit.NONE:
            return
        if self.credit is Credit.CONNECTION:
            self.conn.increment_flow_control_window(event.flow_controlled_length)
            return
        try:
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        except h2.exceptions.StreamClosedError:
            self.conn.increment_flow_control_window(event.flow_controlled_length)

    def _parse(self, data: bytes) -> bytes:
        """Records the complete frames in `data`; returns the bytes for h2: those frames but GOAWAY.

        h2 turns the whole connection CLOSED on a GOAWAY and would then refuse the answers
        a graceful GOAWAY lets finish, so GOAWAY is only recorded (`goaways`), never fed to it.
        """
        keep = b""
        if self._preface_left:
            skip = min(self._preface_left, len(data))
            self._preface_left -= skip
            keep, data = data[:skip], data[skip:]
        buf = self._raw + data
        pos = 0
        out = bytearray(keep)
        while len(buf) - pos >= 9:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            if len(buf) - pos < 9 + length:
                break
            sid = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            raw = RawFrame(buf[pos + 3], buf[pos + 4], sid, buf[pos + 9 : pos + 9 + length])
            self.frames.append(raw)
            if raw.ftype != GOAWAY:
                out += buf[pos : pos + 9 + length]
            pos += 9 + length
        self._raw = buf[pos:]
        return bytes(out)

    def close(self) -> None:
        self.sock.close()

    # --- what arrived ------------------------------------------------------------------------------

    def frames_of(self, ftype: int, stream_id: int | None = None) -> list[RawFrame]:
        return [f for f in self.frames if f.ftype == ftype and (stream_id is None or f.stream_id == stream_id)]

    @property
    def goaways(self) -> list[tuple[int, int]]:
        """(last stream id, error code) of every GOAWAY received."""
        return [
            (int.from_bytes(f.payload[:4], "big") & 0x7FFFFFFF, int.from_bytes(f.payload[4:8], "big"))
            for f in self.frames_of(GOAWAY)
        ]

    def resets(self, stream_id: int) -> list[int]:
        return [int.from_bytes(f.payload, "big") for f in self.frames_of(RST_STREAM, stream_id)]

    def of(self, kind: type[Any], stream_id: int | None = None) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind) and (stream_id is None or e.stream_id == stream_id)]

    def ended(self, stream_id: int) -> bool:
        return bool(self.of(h2.events.StreamEnded, stream_id) or self.of(h2.events.StreamReset, stream_id))

    def body(self, stream_id: int) -> bytes:
        return b"".join(e.data for e in self.of(h2.events.DataReceived, stream_id))

    def headers(self, stream_id: int) -> Headers:
        """Every header field received on the stream: request or response headers, then trailers."""
        kinds = (h2.events.RequestReceived, h2.events.ResponseReceived, h2.events.TrailersReceived)
        fields: Headers = []
        for e in self.events:
            if isinstance(e, kinds) and e.stream_id == stream_id:
                fields += list(e.headers)
        return fields

    def describe(self) -> str:
        kinds = [type(e).__name__ for e in self.events[-8:]]
        return f"{self.name}: eof={self.eof} error={self.error!r} goaways={self.goaways} last events={kinds}"


class RuntimeListener:
    """The runtime's listening socket; each accepted connection is an h2 server `Peer`."""

    def __init__(self, path: str, *, settings: dict[int, int] | None = None) -> None:
        if os.path.exists(path):
            os.unlink(path)
        self.path = path
        self.settings = settings
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(16)

    @property
    def address(self) -> str:
        return f"unix://{self.path}"

    def accept(self, timeout: float = 5.0) -> Peer:
        """The next connection the proxy dialled for a kubelet connection.

        The proxy also dials by itself to learn whether the runtime is up (its admin health,
        runtimeproxy/backend_health.py) and closes such a dial at once without a byte: one that
        ends before its first byte is skipped.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            sock, _ = self.sock.accept()
            sock.settimeout(max(min(deadline - time.monotonic(), 1.0), 0.01))
            try:
                probe = sock.recv(1, socket.MSG_PEEK) == b""
            except TimeoutError:
                probe = False  # silent, but open: the test's kubelet has not written yet
            if not probe:
                break
            sock.close()
        sock.settimeout(None)
        return Peer(sock, client=False, name="runtime", settings=self.settings)

    def close(self) -> None:
        self.sock.close()


def pump(peers: Sequence[Peer], until: Callable[[], object], *, timeout: float = 5.0, what: str = "") -> None:
    """Reads every peer until `until()` holds; fails, describing both ends, after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not until():
        remaining = deadline - time.monotonic()
        live = [p for p in peers if not p.eof]
        if remaining <= 0 or not live:
            raise AssertionError(f"waited {timeout}s for {what or until}:\n" + "\n".join(p.describe() for p in peers))
        ready, _, _ = select.select([p.sock for p in live], [], [], min(remaining, 0.05))
        for p in live:
            if p.sock in ready:
                p.read()


# --- gRPC on top ------------------------------------------------------------------------------------


def request_headers(path: str, extra: Iterable[tuple[bytes, bytes]] = ()) -> Headers:
    return [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"localhost"),
        (b"content-type", b"application/grpc"), (b"te", b"trailers"), *extra,
    ]


def request(peer: Peer, path: str, body: bytes | None = None, *, end: bool = True,
            extra: Iterable[tuple[bytes, bytes]] = ()) -> int:
    """Opens a gRPC call; `body` (already length-prefixed) is sent whole when the windows allow it."""
    sid: int = peer.conn.get_next_available_stream_id()
    peer.conn.send_headers(sid, request_headers(path, extra), end_stream=body is None and end)
    peer.flush()
    if body is not None:
        send_body([peer], peer, sid, body, end=end)
    return sid


def send_body(peers: Sequence[Peer], sender: Peer, sid: int, body: bytes, *, end: bool = True) -> None:
    """Sends DATA as fast as the receiver's windows allow, reading `peers` while they are shut."""
    while True:
        n = min(sender.conn.local_flow_control_window(sid), sender.conn.max_outbound_frame_size, len(body))
        if n or not body:
            last = n == len(body)
            sender.conn.send_data(sid, body[:n], end_stream=end and last)
            sender.flush()
            body = body[n:]
            if last:
                return
            continue
        pump([*peers, sender] if sender not in peers else peers,
             lambda: sender.conn.local_flow_control_window(sid) > 0, what=f"window for stream {sid}")


def respond(peer: Peer, sid: int, message: bytes, *, status: int = 0, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """A unary gRPC answer from the runtime end."""
    peer.conn.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc"), *extra])
    peer.conn.send_data(sid, grpc_frame(message))
    peer.conn.send_headers(sid, [(b"grpc-status", str(status).encode())], end_stream=True)
    peer.flush()


def status_of(peer: Peer, sid: int) -> tuple[int, str]:
    """The gRPC status and message kubelet got on a stream."""
    fields = dict(peer.headers(sid))
    return int(fields.get(b"grpc-status", b"-1")), fields.get(b"grpc-message", b"").decode()


# --- CRI messages and a proxy in front of an h2 runtime -----------------------------------------------

CREATE_CONTAINER = "/runtime.v1.RuntimeService/CreateContainer"


def create_container_request(*, name: str = "c", envs: dict[str, str] | None = None,
                             annotations: dict[str, str] | None = None, future_field: str = "") -> bytes:
    """A serialized CreateContainerRequest as kubelet sends it (the pod's config included)."""
    m = messages()
    pod = m.PodSandboxConfig(
        metadata=m.PodSandboxMetadata(name="p", uid="uid-1", namespace="default", attempt=0),
        labels={"io.kubernetes.pod.name": "p"}, annotations=annotations or {},
    )
    config = m.ContainerConfig(
        metadata=m.ContainerMetadata(name=name), image=m.ImageSpec(image="fgpu.local/busybox:1"),
        envs=[m.KeyValue(key=k, value=v.encode()) for k, v in (envs or {}).items()],
        fgpu_future_field=future_field,
    )
    request: bytes = m.CreateContainerRequest(pod_sandbox_id="sandbox-1", config=config, sandbox_config=pod).SerializeToString()
    return request


def parse_create_request(message: bytes) -> Any:
    return messages().CreateContainerRequest.FromString(message)


def env_of(message: bytes) -> dict[str, bytes]:
    return {e.key: e.value for e in parse_create_request(message).config.envs}


@contextlib.contextmanager
def proxy_before_h2_runtime(**overrides: object) -> Iterator[tuple[ProxyRig, RuntimeListener]]:
    """A started in-process proxy whose backend is an h2 `RuntimeListener` (accept one connection per kubelet)."""
    base = tempfile.mkdtemp(prefix="fgpu-h2-", dir="/tmp")
    runtime = RuntimeListener(os.path.join(base, "runtime.sock"))
    rig = ProxyRig(backend=runtime.address)
    rig.start(**overrides)
    try:
        yield rig, runtime
    finally:
        if rig.thread is not None:  # peers left open would hold a drain for its whole grace
            rig.thread.stop(grace=0.2)
            rig.thread = None
        runtime.close()


def listen_path(rig: ProxyRig) -> str:
    return rig.listen.removeprefix("unix://")


def connect_pair(rig: ProxyRig, runtime: RuntimeListener) -> tuple[Peer, Peer]:
    """kubelet connected through the proxy, and the runtime connection the proxy dialled for it."""
    kubelet = Peer.connect(listen_path(rig))
    backend = runtime.accept()
    pump([kubelet, backend], lambda: kubelet.of(h2.events.RemoteSettingsChanged) and backend.of(h2.events.SettingsAcknowledged),
         what="the SETTINGS exchange")
    return kubelet, backend
