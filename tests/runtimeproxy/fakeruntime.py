"""A stand-in CRI runtime that records the raw bytes it receives, for checks containerd cannot show.

Methods (generic handlers on raw bytes, so nothing is re-encoded on this side):
- `/test.Echo/Unary`: answers the request bytes; echoes `x-echo` metadata back as
  initial and trailing metadata;
- `/test.Echo/Fail`: aborts with the code named by `x-code` and the request (UTF-8) as details;
- `/test.Echo/Stream`: streams `int(request)` messages;
- `/test.Echo/Wait`: blocks until the call is cancelled or its deadline passes, recording what it saw;
- `/runtime.v1.RuntimeService/CreateContainer`: records the request, answers container_id "fake".
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from apis import names
from apis.grpc_server import CHANNEL_OPTIONS, add_listener

CREATE_CONTAINER = f"/{names.CRI_RUNTIME_SERVICE}/CreateContainer"


@dataclass
class Seen:
    method: str
    request: bytes
    metadata: dict[str, str]
    time_remaining: float | None
    #: when the handler ran (`time.time()`, the clock grpcio's deadlines are on)
    at: float = 0.0


@dataclass
class FakeRuntime:
    socket_path: str
    seen: list[Seen] = field(default_factory=list)
    cancelled: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: grpc.Server | None = None

    @property
    def address(self) -> str:
        return f"unix://{self.socket_path}"

    def _record(self, method: str, request: bytes, context: Any) -> None:
        with self.lock:
            remaining = context.time_remaining()
            self.seen.append(Seen(method, request, dict(context.invocation_metadata()), remaining, time.time()))

    def last(self, method: str) -> Seen:
        with self.lock:
            return [s for s in self.seen if s.method == method][-1]

    def start(self) -> FakeRuntime:
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=32), options=list(CHANNEL_OPTIONS))
        server.add_generic_rpc_handlers((_Handler(self),))
        add_listener(server, self.address)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, owner: FakeRuntime) -> None:
        self.owner = owner

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        owner = self.owner

        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            owner._record(method, request, context)
            md = dict(context.invocation_metadata())
            if method == "/test.Echo/Unary":
                if "x-echo" in md:
                    context.send_initial_metadata((("x-echo", md["x-echo"]),))
                    context.set_trailing_metadata((("x-echo-trailer", md["x-echo"]),))
                return request
            if method == "/test.Echo/Fail":
                code = grpc.StatusCode[md.get("x-code", "NOT_FOUND")]
                context.abort(code, request.decode())
            if method == "/test.Echo/Wait":
                done = threading.Event()
                context.add_callback(lambda: (owner.cancelled.set(), done.set()))
                done.wait(30)
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "waited")
            if method == CREATE_CONTAINER:
                return b"\x0a\x04fake"
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"unknown method {method}")
            raise AssertionError("unreachable")

        def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            owner._record(method, request, context)
            for i in range(int(request)):
                yield str(i).encode()

        if method == "/test.Echo/Stream":
            return grpc.unary_stream_rpc_method_handler(stream)
        return grpc.unary_unary_rpc_method_handler(unary)
