"""gRPC calls spoken by hand over the h2 peers: prepared CRI messages, headers, requests and answers.

    sid = request(pair.client, VERSION, VERSION_REQUEST)
    got = await_request(pair, sid)                 # the runtime has the whole request
    respond(pair.runtime, sid, VERSION_RESPONSE)
    answer = await_answer(pair, sid)               # the client has headers, message and trailers

Every request carries an `x-call` header with a fresh value, which h2's encoder
adds to the HPACK dynamic table, and every answer an `x-answer` one; both are
sent again on later streams as indexed references. A table that went out of
step anywhere between the peers shows as a decoding error or a wrong header
on the next stream.
"""

from __future__ import annotations

import gzip
import itertools
from dataclasses import dataclass

import h2.events

from apis import names
from apis.cri.v1 import runtime_partial_pb2 as cri
from tests.runtimeproxy.h2conformance.peers import Pair, Peer

RUNTIME = f"/{names.CRI_RUNTIME_SERVICE}/"
VERSION = RUNTIME + "Version"
CREATE_CONTAINER = RUNTIME + "CreateContainer"
#: a method the proxy has never heard of: passed through like Version
UNKNOWN = "/test.Echo/Unary"

VERSION_REQUEST = b"\n\x02v1"
#: VersionResponse{version: "0.1.0", runtime_name: "h2-fake", runtime_version: "1.0", runtime_api_version: "v1"}
VERSION_RESPONSE = b"\n\x050.1.0\x12\x07h2-fake\x1a\x031.0\"\x02v1"
#: CreateContainerResponse{container_id: "h2-fake"}
CREATE_RESPONSE = b"\n\x07h2-fake"
ALLOCATION = '{"gpu":[{"minor":0,"id":"GPU-h2","resources":{"koordinator.sh/gpu-core":"100"}}]}'

_calls = itertools.count(1)


def grpc_frame(message: bytes, *, compressed: bool = False) -> bytes:
    return (b"\x01" if compressed else b"\x00") + len(message).to_bytes(4, "big") + message


def grpc_unframe(body: bytes) -> bytes:
    assert len(body) >= 5, body
    length = int.from_bytes(body[1:5], "big")
    assert len(body) == 5 + length, (len(body), length)
    message = body[5:]
    return gzip.decompress(message) if body[0] & 1 else message


def create_request(*, name: str = "c", uid: str = "uid-1", env_bytes: int = 0, allocation: bool = False) -> bytes:
    """A CreateContainerRequest, `env_bytes` of environment big (100-byte values)."""
    req = cri.CreateContainerRequest(pod_sandbox_id="sandbox-h2")
    req.config.metadata.name = name
    req.config.image.image = "fgpu.local/busybox:1"
    for i in range(-(-env_bytes // 110)):
        req.config.envs.add(key=f"VAR_{i:05d}", value=b"x" * 100)
    req.sandbox_config.metadata.name = "pod-h2"
    req.sandbox_config.metadata.uid = uid
    req.sandbox_config.metadata.namespace = "default"
    if allocation:
        req.sandbox_config.annotations[names.DEVICE_ALLOCATED] = ALLOCATION
    return req.SerializeToString()


def request_headers(path: str, *, extra: tuple[tuple[bytes, bytes], ...] = ()) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()), (b":authority", b"localhost"),
        (b"te", b"trailers"), (b"content-type", b"application/grpc"), (b"user-agent", b"h2-kubelet"),
        (b"x-call", f"call-{next(_calls)}".encode()), *extra,
    ]


RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def request(client: Peer, path: str, message: bytes, *, end: bool = True, headers: list[tuple[bytes, bytes]] | None = None,
            compressed: bool = False, flush: bool = True) -> int:
    """Opens a stream and sends the call's headers and (when it fits the window) its message."""
    sid = client.conn.get_next_available_stream_id()
    hdrs = headers or request_headers(path, extra=((b"grpc-encoding", b"gzip"),) if compressed else ())
    client.conn.send_headers(sid, hdrs)
    client.sent_headers[sid] = hdrs
    body = grpc_frame(gzip.compress(message) if compressed else message, compressed=compressed)
    if end:
        send_body(client, sid, body, end=True)
    if flush:
        client.flush()
    return sid


def send_body(peer: Peer, sid: int, body: bytes, *, end: bool = True, pad: int | None = None) -> None:
    """Sends `body` in frames of at most the peer's frame size; all of it must fit the current windows."""
    step = peer.conn.max_outbound_frame_size - (pad + 1 if pad else 0)
    chunks = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    for i, chunk in enumerate(chunks):
        peer.conn.send_data(sid, chunk, end_stream=end and i == len(chunks) - 1, pad_length=pad)


def send_all(pair: Pair, sender: Peer, sid: int, body: bytes, *, end: bool = True, timeout: float = 5.0) -> None:
    """Sends `body` as the windows allow, pumping both peers for credit in between."""
    pos = 0
    while pos < len(body) or (end and pos == len(body) == 0):
        room = min(sender.conn.max_outbound_frame_size, sender.conn.local_flow_control_window(sid))
        if room <= 0 and pos < len(body):
            pair.pump(lambda: sender.conn.local_flow_control_window(sid) > 0 or sender.dead, timeout=timeout,
                      what=f"credit for stream {sid} at {pos}/{len(body)} bytes")
            if sender.dead:
                return
            continue
        chunk = body[pos : pos + room]
        pos += len(chunk)
        sender.conn.send_data(sid, chunk, end_stream=end and pos == len(body))
        sender.flush()
        if not chunk:
            break


@dataclass(frozen=True)
class Request:
    """What the runtime received on one stream."""

    headers: list[tuple[bytes, bytes]]
    message: bytes


def request_done(runtime: Peer, sid: int) -> bool:
    return bool(runtime.of(h2.events.StreamEnded, sid) or runtime.of(h2.events.StreamReset, sid))


def await_request(pair: Pair, sid: int, *, timeout: float = 3.0) -> Request:
    pair.pump(lambda: request_done(pair.runtime, sid) or pair.runtime.dead, timeout=timeout,
              what=f"the request of stream {sid} at the runtime")
    assert pair.runtime.of(h2.events.StreamEnded, sid), pair.runtime.describe()
    blocks = pair.runtime.headers(sid)
    return Request(headers=blocks[0], message=grpc_unframe(pair.runtime.body(sid)))


def respond(runtime: Peer, sid: int, message: bytes, *, status: int = 0, details: str = "",
            headers: list[tuple[bytes, bytes]] | None = None, flush: bool = True) -> list[tuple[bytes, bytes]]:
    """Headers, one message (when it fits the window) and trailers; returns the trailers sent."""
    runtime.conn.send_headers(sid, headers or [*RESPONSE_HEADERS, (b"x-answer", f"answer-{next(_calls)}".encode())])
    trailers = [(b"grpc-status", str(status).encode())]
    if details:
        trailers.append((b"grpc-message", details.encode()))
    if status == 0:
        send_body(runtime, sid, grpc_frame(message), end=False)
    runtime.conn.send_headers(sid, trailers, end_stream=True)
    if flush:
        runtime.flush()
    return trailers


@dataclass(frozen=True)
class Answer:
    """What the client received on one stream."""

    headers: list[tuple[bytes, bytes]]
    message: bytes | None
    trailers: list[tuple[bytes, bytes]]

    @property
    def status(self) -> int:
        return int(dict(self.trailers or self.headers).get(b"grpc-status", b"-1"))

    @property
    def details(self) -> str:
        return dict(self.trailers or self.headers).get(b"grpc-message", b"").decode()


def await_answer(pair: Pair, sid: int, *, timeout: float = 3.0) -> Answer:
    client = pair.client
    pair.pump(lambda: client.ended(sid) or client.dead, timeout=timeout, what=f"the answer on stream {sid}")
    assert client.of(h2.events.StreamEnded, sid), client.describe()
    blocks = client.headers(sid)
    body = client.body(sid)
    if len(blocks) == 1:  # trailers-only
        return Answer(headers=blocks[0], message=None, trailers=[])
    return Answer(headers=blocks[0], message=grpc_unframe(body) if body else None, trailers=blocks[-1])


def roundtrip(pair: Pair, path: str = VERSION, message: bytes = VERSION_REQUEST,
              answer: bytes = VERSION_RESPONSE) -> tuple[Request, Answer]:
    """One whole call, checking that each side got exactly what the other sent (HPACK intact both ways)."""
    sid = request(pair.client, path, message)
    got = await_request(pair, sid)
    assert got.headers == pair.client.sent_headers[sid], got.headers
    if path != CREATE_CONTAINER:
        assert got.message == message
    sent_headers = [*RESPONSE_HEADERS, (b"x-answer", f"answer-{next(_calls)}".encode())]
    trailers = respond(pair.runtime, sid, answer, headers=sent_headers)
    ans = await_answer(pair, sid)
    assert ans.headers == sent_headers, ans.headers
    assert ans.message == answer
    assert ans.trailers == trailers, ans.trailers
    return got, ans

