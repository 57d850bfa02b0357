"""Calls RuntimeHooks servers, one reused channel per endpoint.

A stage is called by its method path (`stages.Stage.path`, from the service
descriptor), so a stage added to hooks.proto needs nothing here.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

from apis.fgpu.v1 import hooks_pb2
from apis.grpc_server import CHANNEL_OPTIONS, parse_address
from runtimeproxy.errors import HookCallError
from runtimeproxy.hookconfig import HookServer
from runtimeproxy.metrics import ProxyMetrics
from runtimeproxy.stages import Stage

# Hook servers are local sockets: try again soon after one comes back, so that
# kubelet's next retry of a refused GPU container finds the channel ready.
_HOOK_CHANNEL_OPTIONS = (
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class HookClient:
    def __init__(self, *, metrics: ProxyMetrics) -> None:
        self.metrics = metrics
        #: endpoint -> its channel and the stages' callables on it
        self._channels: dict[str, tuple[grpc.aio.Channel, dict[str, grpc.aio.UnaryUnaryMultiCallable[Any, Any]]]] = {}

    def _method(self, endpoint: str, stage: Stage) -> grpc.aio.UnaryUnaryMultiCallable[Any, Any]:
        entry = self._channels.get(endpoint)
        if entry is None:
            target = parse_address(endpoint, field="endpoint").grpc_target
            entry = (grpc.aio.insecure_channel(target, options=list(_HOOK_CHANNEL_OPTIONS)), {})
            self._channels[endpoint] = entry
        channel, methods = entry
        method = methods.get(stage.path)
        if method is None:
            # registered, as the generated stubs' methods are (grpc-core then skips a lookup per call)
            method = methods[stage.path] = channel.unary_unary(  # type: ignore[call-arg]  # not in grpc's stubs
                stage.path, request_serializer=_serialize, response_deserializer=hooks_pb2.HookResponse.FromString,
                _registered_method=True,
            )
        return method

    async def call(self, server: HookServer, stage: Stage, request: Message) -> hooks_pb2.HookResponse:
        """One hook call; HookCallError when the server is down, slow or failing."""
        method = self._method(server.endpoint, stage)
        self.metrics.hook_calls.labels(server.name, stage.name).inc()
        t0 = time.perf_counter()
        try:
            response: hooks_pb2.HookResponse = await method(request, timeout=server.timeout_s)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            reason = "timeout" if code is grpc.StatusCode.DEADLINE_EXCEEDED else str(code.value[1])
            self.metrics.hook_errors.labels(server.name, stage.name, reason).inc()
            detail = (
                f"no answer within {server.timeout_s:g}s" if code is grpc.StatusCode.DEADLINE_EXCEEDED
                else f"{code.name}: {exc.details()}"
            )
            raise HookCallError(server.name, f"{detail} (endpoint {server.endpoint})") from None
        finally:
            self.metrics.hook_duration.labels(server.name, stage.name).observe(time.perf_counter() - t0)
        if response.HasField("rejection"):
            self.metrics.hook_errors.labels(server.name, stage.name, "rejected").inc()
        return response

    async def forget_others(self, endpoints: set[str]) -> None:
        """Closes channels to endpoints no longer registered."""
        for endpoint in list(self._channels):
            if endpoint not in endpoints:
                channel, _ = self._channels.pop(endpoint)
                await channel.close(None)

    async def close(self) -> None:
        await self.forget_others(set())
