"""Calls RuntimeHooks servers, one reused channel per endpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from apis.grpc_server import CHANNEL_OPTIONS, parse_address
from runtimeproxy.errors import HookCallError
from runtimeproxy.hookconfig import HookServer, Stage
from runtimeproxy.metrics import ProxyMetrics

# Hook servers are local sockets: try again soon after one comes back, so that
# kubelet's next retry of a refused GPU container finds the channel ready.
_HOOK_CHANNEL_OPTIONS = (
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class HookClient:
    def __init__(self, *, metrics: ProxyMetrics) -> None:
        self.metrics = metrics
        self._stubs: dict[str, tuple[grpc.aio.Channel, hooks_pb2_grpc.RuntimeHooksStub]] = {}

    def _stub(self, endpoint: str) -> hooks_pb2_grpc.RuntimeHooksStub:
        entry = self._stubs.get(endpoint)
        if entry is None:
            target = parse_address(endpoint, field="endpoint").grpc_target
            channel = grpc.aio.insecure_channel(target, options=list(_HOOK_CHANNEL_OPTIONS))
            entry = (channel, hooks_pb2_grpc.RuntimeHooksStub(channel))  # type: ignore[no-untyped-call]
            self._stubs[endpoint] = entry
        return entry[1]

    async def call(self, server: HookServer, stage: Stage, request: Any) -> hooks_pb2.HookResponse:
        """One hook call; HookCallError when the server is down, slow or failing."""
        method: Callable[..., Any] = getattr(self._stub(server.endpoint), stage.value)
        self.metrics.hook_calls.labels(server.name, stage.value).inc()
        t0 = time.perf_counter()
        try:
            response: hooks_pb2.HookResponse = await method(request, timeout=server.timeout_s)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            reason = "timeout" if code is grpc.StatusCode.DEADLINE_EXCEEDED else str(code.value[1])
            self.metrics.hook_errors.labels(server.name, stage.value, reason).inc()
            detail = (
                f"no answer within {server.timeout_s:g}s" if code is grpc.StatusCode.DEADLINE_EXCEEDED
                else f"{code.name}: {exc.details()}"
            )
            raise HookCallError(server.name, f"{detail} (endpoint {server.endpoint})") from None
        finally:
            self.metrics.hook_duration.labels(server.name, stage.value).observe(time.perf_counter() - t0)
        if response.HasField("rejection"):
            self.metrics.hook_errors.labels(server.name, stage.value, "rejected").inc()
        return response

    async def forget_others(self, endpoints: set[str]) -> None:
        """Closes channels to endpoints no longer registered."""
        for endpoint in list(self._stubs):
            if endpoint not in endpoints:
                channel, _ = self._stubs.pop(endpoint)
                await channel.close(None)

    async def close(self) -> None:
        await self.forget_others(set())
