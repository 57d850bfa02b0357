"""The proxy's hook client (its own HTTP/2 connection per hook server): against grpcio's server, and an `h2` peer.

grpcio's server (the test hook server, as the agent serves hooks) checks the
requests are real gRPC; the `h2` peer sends what grpcio never does (GOAWAY in
the middle of calls, PINGs, header blocks split into CONTINUATIONs, broken
frames).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest

from apis import names
from apis.fgpu.v1 import hooks_pb2
from runtimeproxy.errors import HookCallError
from runtimeproxy.hookclient import HookClient
from runtimeproxy.hookconfig import FailurePolicy, HookServer
from runtimeproxy.metrics import ProxyMetrics
from runtimeproxy.stages import RUNTIME_HOOKS
from tests.runtimeproxy.hookserver import HookBehaviour, TestHookServer, gpu_value

STAGE = RUNTIME_HOOKS["PreCreateContainer"]
ALLOCATION = '{"gpu": [{"minor": 0, "id": "GPU-x", "resources": {}}]}'


def _registration(endpoint: str, *, timeout_s: float = 2.0) -> HookServer:
    return HookServer(name="h", endpoint=endpoint, stages=frozenset({STAGE}), failure_policy=FailurePolicy.FAIL,
                      timeout_s=timeout_s)


def _request(uid: str = "uid-1", *, padding: int = 0) -> hooks_pb2.ContainerHookRequest:
    req = hooks_pb2.ContainerHookRequest()
    req.pod.uid = uid
    req.pod.annotations[names.DEVICE_ALLOCATED] = ALLOCATION
    if padding:
        req.pod.annotations["example.com/padding"] = "x" * padding
    return req


def _errors(metrics: ProxyMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "fgpu_runtime_proxy_hook_errors_total", {"server": "h", "stage": "PreCreateContainer", "reason": reason}
    )
    return value or 0.0


@pytest.fixture
def grpc_hook() -> Iterator[TestHookServer]:
    base = tempfile.mkdtemp(prefix="fgpu-hookconn-", dir="/tmp")
    server = TestHookServer(socket_path=os.path.join(base, "hooks.sock")).start()
    yield server
    server.stop()


def test_answers_come_back_and_concurrent_calls_share_one_connection(grpc_hook: TestHookServer) -> None:
    async def main() -> list[hooks_pb2.HookResponse]:
        client = HookClient(metrics=ProxyMetrics())
        server = _registration(grpc_hook.endpoint)
        answers = await asyncio.gather(*(client.call(server, STAGE, _request(f"uid-{i}")) for i in range(8)))
        assert len(client._connections) == 1
        await client.close()
        return list(answers)

    answers = asyncio.run(main())
    for i, answer in enumerate(answers):
        assert {kv.key: kv.value for kv in answer.set_envs}[names.NVIDIA_VISIBLE_DEVICES] == gpu_value(f"uid-{i}")
    assert len(grpc_hook.requests("PreCreateContainer")) == 8


def test_a_request_larger_than_the_servers_windows_reaches_it_whole(grpc_hook: TestHookServer) -> None:
    async def main() -> None:
        client = HookClient(metrics=ProxyMetrics())
        await client.call(_registration(grpc_hook.endpoint), STAGE, _request(padding=300_000))
        await client.close()

    asyncio.run(main())
    [seen] = grpc_hook.requests("PreCreateContainer")
    assert seen.pod.annotations["example.com/padding"] == "x" * 300_000


def test_a_stopped_server_fails_the_call_unavailable_and_a_restarted_one_is_dialled_again(
    grpc_hook: TestHookServer,
) -> None:
    metrics = ProxyMetrics()

    async def main() -> None:
        client = HookClient(metrics=metrics)
        server = _registration(grpc_hook.endpoint)
        await client.call(server, STAGE, _request())
        grpc_hook.stop()
        with pytest.raises(HookCallError) as err:
            await client.call(server, STAGE, _request())
        assert "UNAVAILABLE" in err.value.reason and grpc_hook.endpoint in err.value.reason
        grpc_hook.start()
        answer = await client.call(server, STAGE, _request("uid-back"))
        assert {kv.key: kv.value for kv in answer.set_envs}[names.NVIDIA_VISIBLE_DEVICES] == gpu_value("uid-back")
        await client.close()

    asyncio.run(main())
    assert _errors(metrics, "unavailable") == 1


def test_a_slow_hook_times_out_and_the_connection_serves_the_next_call(grpc_hook: TestHookServer) -> None:
    metrics = ProxyMetrics()
    grpc_hook.behaviour = HookBehaviour(delay_s=0.5)

    async def main() -> None:
        client = HookClient(metrics=metrics)
        with pytest.raises(HookCallError) as err:
            await client.call(_registration(grpc_hook.endpoint, timeout_s=0.1), STAGE, _request())
        assert "no answer within 0.1s" in err.value.reason
        grpc_hook.behaviour = HookBehaviour()
        await client.call(_registration(grpc_hook.endpoint), STAGE, _request())
        assert len(client._connections) == 1
        await client.close()

    asyncio.run(main())
    assert _errors(metrics, "timeout") == 1


def test_a_failing_hook_gives_its_status_and_message(grpc_hook: TestHookServer) -> None:
    def boom(request: Any) -> hooks_pb2.HookResponse:
        raise RuntimeError("agent ledger broken: 100% used")

    grpc_hook.behaviour = HookBehaviour(extra=boom)
    metrics = ProxyMetrics()

    async def main() -> None:
        client = HookClient(metrics=metrics)
        with pytest.raises(HookCallError) as err:
            await client.call(_registration(grpc_hook.endpoint), STAGE, _request())
        assert err.value.reason.startswith("UNKNOWN: ")
        assert "agent ledger broken: 100% used" in err.value.reason
        await client.close()

    asyncio.run(main())
    assert _errors(metrics, "unknown") == 1


# --- an h2 peer as the hook server ------------------------------------------------------------------

Script = Callable[["_H2Hook", int, bytes], None]


class _H2Hook(asyncio.Protocol):
    """A hook server on the `h2` package; `script` answers each request (stream id, its body)."""

    def __init__(self, script: Script, connections: list[_H2Hook]) -> None:
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.script = script
        self.bodies: dict[int, bytes] = {}
        self.pings_acked = 0
        self.transport: asyncio.Transport | None = None
        self.ended: list[int] = []
        self.connections = connections
        connections.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        assert self.transport is not None
        self.transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id] = self.bodies.get(event.stream_id, b"") + event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.script(self, event.stream_id, self.bodies.pop(event.stream_id, b""))
            elif isinstance(event, h2.events.PingAckReceived):
                self.pings_acked += 1
        self.flush()

    def answer(self, sid: int, response: hooks_pb2.HookResponse, *, big_metadata: bool = False) -> None:
        extra = [(b"x-padding", b"p" * 40_000)] if big_metadata else []
        self.h2.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc"), *extra])
        data = response.SerializeToString()
        self.h2.send_data(sid, b"\x00" + len(data).to_bytes(4, "big") + data)
        self.h2.send_headers(sid, [(b"grpc-status", b"0"), *extra], end_stream=True)


def _run_against(script: Script, body: Callable[[HookClient, HookServer, list[_H2Hook]], Any]) -> None:
    async def main() -> None:
        path = os.path.join(tempfile.mkdtemp(prefix="fgpu-h2hook-", dir="/tmp"), "hook.sock")
        connections: list[_H2Hook] = []
        server = await asyncio.get_running_loop().create_unix_server(lambda: _H2Hook(script, connections), path)
        client = HookClient(metrics=ProxyMetrics())
        try:
            await body(client, _registration(f"unix://{path}"), connections)
        finally:
            await client.close()
            server.close()

    asyncio.run(main())


def _env(value: str) -> hooks_pb2.HookResponse:
    return hooks_pb2.HookResponse(set_envs=[hooks_pb2.KeyValue(key="X", value=value)])


def test_header_blocks_split_into_continuations_and_pings_are_handled() -> None:
    def script(peer: _H2Hook, sid: int, body: bytes) -> None:
        peer.h2.ping(b"12345678")
        peer.answer(sid, _env("big"), big_metadata=True)

    async def body(client: HookClient, server: HookServer, peers: list[_H2Hook]) -> None:
        for _ in range(2):  # the second reads blocks that refer to the first's table entries
            answer = await client.call(server, STAGE, _request())
            assert answer.set_envs[0].value == "big"
        for _ in range(100):  # the last ACK may still be on its way
            if peers[0].pings_acked == 2:
                break
            await asyncio.sleep(0.01)
        assert peers[0].pings_acked == 2

    _run_against(script, body)


def test_goaway_fails_the_calls_above_its_last_stream_and_the_next_call_dials_again() -> None:
    def script(peer: _H2Hook, sid: int, body: bytes) -> None:
        peer.ended.append(sid)
        if peer is not peer.connections[0]:
            peer.answer(sid, _env("again"))
        elif sorted(peer.ended) == [1, 3]:
            # both calls are in: the server goes away after stream 1, and still answers it
            assert peer.transport is not None
            peer.transport.write(b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + (1).to_bytes(4, "big") + bytes(4))
            peer.answer(1, _env("first"))

    async def body(client: HookClient, server: HookServer, peers: list[_H2Hook]) -> None:
        results = await asyncio.gather(
            client.call(server, STAGE, _request()), client.call(server, STAGE, _request()), return_exceptions=True
        )
        assert isinstance(results[0], hooks_pb2.HookResponse) and results[0].set_envs[0].value == "first"
        assert isinstance(results[1], HookCallError) and "UNAVAILABLE" in results[1].reason
        answer = await client.call(server, STAGE, _request())
        assert answer.set_envs[0].value == "again"
        assert len(peers) == 2

    _run_against(script, body)


def test_a_broken_frame_fails_the_call_and_the_next_call_uses_a_new_connection() -> None:
    def script(peer: _H2Hook, sid: int, body: bytes) -> None:
        if peer is peer.connections[0]:
            assert peer.transport is not None
            peer.transport.write(b"\x00\x00\x03\x08\x00\x00\x00\x00\x00abc")  # WINDOW_UPDATE of 3 octets
        else:
            peer.answer(sid, _env("fine"))

    async def body(client: HookClient, server: HookServer, peers: list[_H2Hook]) -> None:
        with pytest.raises(HookCallError) as err:
            await client.call(server, STAGE, _request())
        assert "UNAVAILABLE" in err.value.reason and "FRAME_SIZE_ERROR" in err.value.reason
        answer = await client.call(server, STAGE, _request())
        assert answer.set_envs[0].value == "fine"
        assert len(peers) == 2

    _run_against(script, body)
