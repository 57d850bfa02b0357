"""Calls RuntimeHooks servers, one reused HTTP/2 connection per endpoint (`hook_connection`).

A stage is called by its method path (`stages.Stage.path`, from the service
descriptor), so a stage added to hooks.proto needs nothing here.

A connection is dialled when a call needs one: the first call, the first after
the server went away (closed, GOAWAY, a broken frame). Hook servers are local
sockets, so there is no backoff: kubelet's next retry of a refused GPU
container dials at once and finds a restarted hook server. Concurrent calls to
one endpoint share one dial and one connection. The deadline (the
registration's `timeout`) covers the dial and the call.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import time
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from apis.fgpu.v1 import hooks_pb2
from apis.grpc_server import parse_address
from runtimeproxy.errors import HookCallError
from runtimeproxy.hook_connection import CallFailed, HookConnection
from runtimeproxy.hookconfig import HookServer
from runtimeproxy.metrics import ProxyMetrics
from runtimeproxy.stages import Stage

_CODES = {int(c.value[0]): c for c in grpc.StatusCode}
_UNAVAILABLE = int(grpc.StatusCode.UNAVAILABLE.value[0])


class HookClient:
    def __init__(self, *, metrics: ProxyMetrics) -> None:
        self.metrics = metrics
        self._connections: dict[str, HookConnection] = {}
        self._dials: dict[str, asyncio.Task[HookConnection]] = {}
        #: (server, stage) -> its metric children: a `labels()` lookup takes a lock and builds a key each time
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    async def call(self, server: HookServer, stage: Stage, request: Message) -> hooks_pb2.HookResponse:
        """One hook call; HookCallError when the server is down, slow or failing."""
        children = self._children.get((server.name, stage.name))
        if children is None:
            children = self._children[(server.name, stage.name)] = (
                self.metrics.hook_calls.labels(server.name, stage.name),
                self.metrics.hook_duration.labels(server.name, stage.name),
            )
        calls, duration = children
        calls.inc()
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(server.timeout_s):
                connection = await self._connection(server.endpoint)
                answer = await connection.call(stage.path, request.SerializeToString(), timeout_s=server.timeout_s)
            response = hooks_pb2.HookResponse.FromString(answer)
        except TimeoutError:
            raise self._failed(server, stage, "timeout", f"no answer within {server.timeout_s:g}s") from None
        except CallFailed as exc:
            code = _CODES.get(exc.code, grpc.StatusCode.UNKNOWN)
            raise self._failed(server, stage, str(code.value[1]), f"{code.name}: {exc.details}") from None
        except DecodeError as exc:
            reason = str(grpc.StatusCode.INTERNAL.value[1])
            raise self._failed(server, stage, reason, f"INTERNAL: cannot decode the hook's answer: {exc}") from None
        finally:
            duration.observe(time.perf_counter() - t0)
        if response.HasField("rejection"):
            self.metrics.hook_errors.labels(server.name, stage.name, "rejected").inc()
        return response

    def _failed(self, server: HookServer, stage: Stage, reason: str, detail: str) -> HookCallError:
        self.metrics.hook_errors.labels(server.name, stage.name, reason).inc()
        return HookCallError(server.name, f"{detail} (endpoint {server.endpoint})")

    async def _connection(self, endpoint: str) -> HookConnection:
        connection = self._connections.get(endpoint)
        if connection is not None and connection.usable():
            return connection
        dial = self._dials.get(endpoint)
        if dial is None:
            dial = self._dials[endpoint] = asyncio.get_running_loop().create_task(self._dial(endpoint))
            dial.add_done_callback(lambda _: self._dials.pop(endpoint, None))
        # shielded: one caller's deadline does not cancel the dial the others wait for
        return await asyncio.shield(dial)

    async def _dial(self, endpoint: str) -> HookConnection:
        path = parse_address(endpoint, field="endpoint").unix_path
        if path is None:  # hookconfig accepts unix:// endpoints only
            raise CallFailed(_UNAVAILABLE, f"{endpoint} is not a unix socket")
        try:
            _, connection = await asyncio.get_running_loop().create_unix_connection(
                lambda: HookConnection(endpoint=endpoint), path
            )
        except OSError as exc:
            raise CallFailed(_UNAVAILABLE, f"cannot connect: {not_listening(path, exc)}") from None
        # one that went away still finishes its own calls, and closes itself after them
        self._connections[endpoint] = connection
        return connection

    async def forget_others(self, endpoints: set[str]) -> None:
        """Closes connections to endpoints no longer registered."""
        for endpoint in list(self._connections):
            if endpoint not in endpoints:
                self._connections.pop(endpoint).close()

    async def close(self) -> None:
        await self.forget_others(set())


def not_listening(path: str, exc: OSError) -> str:
    """Why a dial to `path` failed, in the words an operator needs: is the hook server running at all?

    A refused connect reads the same for a socket left behind by a hook server that died, a
    regular file and a directory; what is at the path tells them apart (one lstat, on failure only).
    """
    down = "the hook server is not running there"
    if isinstance(exc, FileNotFoundError):
        return f"no socket at {path}: {down} (or listens elsewhere)"
    if exc.errno != errno.ECONNREFUSED:
        return f"{path}: {exc.strerror or exc}"
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return f"nothing listens on {path}: {down}"
    if stat.S_ISSOCK(mode):
        return f"nothing listens on {path} (a socket left behind): {down}"
    kind = "a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode) else "not a socket"
    return f"{path} is {kind}, not a socket: {down}"
