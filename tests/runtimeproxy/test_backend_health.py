"""The admin socket's CRI health follows the runtime's reachability, without waiting for kubelet to dial.

`BackendHealth` on its own first, with a scripted dial and the waits recorded
instead of slept; then the proxy itself, its admin socket asked with the gRPC
health protocol while the fake runtime comes and goes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apis import names
from runtimeproxy.backend_health import BackendHealth
from runtimeproxy.config import ProxyConfig
from runtimeproxy.server import make_probe
from tests.runtimeproxy.fakeruntime import FakeRuntime
from tests.runtimeproxy.rig import ProxyRig

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ScriptedRuntime:
    """A dial that fails while `up` is False; counts dials, records the waits asked for between them."""

    def __init__(self, *, up: bool) -> None:
        self.up = up
        self.dials = 0
        self.waits: list[float] = []
        self.reports: list[bool] = []
        #: a dial after which the runtime comes up (None: never by itself)
        self.up_after: int | None = None

    async def probe(self) -> None:
        self.dials += 1
        if self.up_after is not None and self.dials > self.up_after:
            self.up = True
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.sleep(0)

    def health(self, **kw: float) -> BackendHealth:
        return BackendHealth(probe=self.probe, report=self.reports.append, backend_name="unix:///run/containerd.sock",
                             sleep=self.sleep, **kw)


async def settle(health: BackendHealth) -> None:
    for _ in range(200):
        if not health.watching:
            return
        await asyncio.sleep(0)
    raise AssertionError("the watch did not end")


def test_a_reachable_runtime_is_dialled_once_at_start_and_reported_serving() -> None:
    runtime = ScriptedRuntime(up=True)

    async def body() -> None:
        health = runtime.health()
        health.start()
        await settle(health)

    asyncio.run(body())
    assert (runtime.dials, runtime.reports, runtime.waits) == (1, [True], [])


def test_an_unreachable_runtime_is_dialled_again_after_waits_that_double_up_to_the_bound() -> None:
    runtime = ScriptedRuntime(up=False)
    runtime.up_after = 8

    async def body() -> None:
        health = runtime.health(first_wait_s=0.25, max_wait_s=5.0)
        health.start()
        await settle(health)
        assert health.reachable is True

    asyncio.run(body())
    assert runtime.waits == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert runtime.reports == [False, True]  # only the changes, not each failed dial


def test_a_failed_relay_dial_reports_down_at_once_and_the_watch_reports_up_when_a_dial_works() -> None:
    runtime = ScriptedRuntime(up=True)

    async def body() -> None:
        health = runtime.health()
        health.start()
        await settle(health)
        runtime.up, runtime.up_after = False, runtime.dials + 2
        health.dialled(False)
        assert runtime.reports == [True, False]
        await settle(health)

    asyncio.run(body())
    assert runtime.reports == [True, False, True]


def test_a_lost_runtime_connection_only_dials_again_and_reports_down_when_that_dial_fails() -> None:
    runtime = ScriptedRuntime(up=True)

    async def body() -> None:
        health = runtime.health()
        health.start()
        await settle(health)
        health.lost()  # one connection closed; the runtime still answers, on every dial up to the longest wait
        await settle(health)
        assert (runtime.dials, runtime.reports, runtime.waits) == (7, [True], [0.25, 0.5, 1.0, 2.0, 4.0])
        runtime.up = False
        health.lost()
        for _ in range(50):
            await asyncio.sleep(0)
        assert runtime.reports == [True, False] and health.watching
        await health.close()

    asyncio.run(body())


def test_a_runtime_that_accepts_one_dial_while_it_shuts_down_is_reported_down() -> None:
    runtime = ScriptedRuntime(up=True)

    async def body() -> None:
        health = runtime.health()
        health.start()
        await settle(health)
        health.lost()  # the runtime closed its connections and still accepts this one dial
        await asyncio.sleep(0)
        assert runtime.dials == 2 and health.watching  # one dial worked; the watch waits to dial again
        runtime.up = False  # then it stops listening
        for _ in range(50):
            await asyncio.sleep(0)
        assert runtime.reports == [True, False] and health.watching
        await health.close()

    asyncio.run(body())


def test_a_working_relay_dial_does_not_end_the_watch_of_a_lost_connection() -> None:
    runtime = ScriptedRuntime(up=True)

    async def body() -> None:
        health = runtime.health()
        health.start()
        await settle(health)
        health.lost()
        await asyncio.sleep(0)
        health.dialled(True)  # kubelet reconnected through a runtime that is still shutting down
        assert health.watching
        runtime.up = False
        for _ in range(50):
            await asyncio.sleep(0)
        assert runtime.reports == [True, False] and health.watching
        await health.close()

    asyncio.run(body())


def test_a_working_relay_dial_ends_the_watch_and_close_ends_it_too() -> None:
    runtime = ScriptedRuntime(up=False)

    async def body() -> None:
        health = runtime.health()
        health.start()
        await asyncio.sleep(0)
        assert health.watching and runtime.reports == [False]
        health.dialled(True)
        await asyncio.sleep(0)
        assert not health.watching and runtime.reports == [False, True]
        health.dialled(False)
        assert health.watching
        await health.close()
        assert not health.watching
        health.lost()  # after close nothing starts again
        assert not health.watching

    asyncio.run(body())


def test_the_wait_bounds_must_be_in_order() -> None:
    with pytest.raises(ValueError, match="first_wait_s=2"):
        ScriptedRuntime(up=True).health(first_wait_s=2.0, max_wait_s=1.0)


def test_the_probe_dials_the_runtime_socket_once_and_raises_an_oserror_while_nothing_listens() -> None:
    directory = tempfile.mkdtemp(prefix="fgpu-probe-", dir="/tmp")
    path = os.path.join(directory, "runtime.sock")
    probe = make_probe(ProxyConfig(backend=f"unix://{path}", backend_dial_timeout_s=1.0))

    async def dial_once() -> None:
        await probe()

    with pytest.raises(OSError):
        asyncio.run(dial_once())
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(1)
        asyncio.run(dial_once())
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.recv(1) == b""  # closed at once, having sent nothing


# --- the proxy's admin socket -----------------------------------------------------------------------


def cri_health(rig: ProxyRig, service: str = names.CRI_RUNTIME_SERVICE) -> int:
    with grpc.insecure_channel(f"unix://{rig.base_dir}/admin.sock") as channel:
        status: int = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[no-untyped-call]
            health_pb2.HealthCheckRequest(service=service), timeout=5
        ).status
    return status


def wait_for_health(rig: ProxyRig, expected: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (status := cri_health(rig)) != expected:
        assert time.monotonic() < deadline, f"admin health stayed {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}"
        time.sleep(0.05)


@pytest.fixture
def late_runtime() -> Iterator[FakeRuntime]:
    """A fake runtime not yet started: its socket does not exist."""
    runtime = FakeRuntime(socket_path=os.path.join(tempfile.mkdtemp(prefix="fgpu-late-", dir="/tmp"), "rt.sock"))
    yield runtime
    runtime.stop()


def test_admin_health_is_not_serving_while_the_runtime_is_absent_and_serving_once_it_appears(
    late_runtime: FakeRuntime,
) -> None:
    rig = ProxyRig(backend=late_runtime.address).start()  # the proxy starts with no runtime at all
    try:
        time.sleep(0.3)  # the dial at start has failed by now
        assert cri_health(rig) == NOT_SERVING
        assert cri_health(rig, names.CRI_IMAGE_SERVICE) == NOT_SERVING
        assert cri_health(rig, "") == SERVING  # the proxy itself is up
        late_runtime.start()
        wait_for_health(rig, SERVING)  # no kubelet connection dialled: the proxy found out by itself
        assert cri_health(rig, names.CRI_IMAGE_SERVICE) == SERVING
        assert rig.metric("fgpu_runtime_proxy_backend_dials_total", {"result": "ok"}) == 0  # probes are not dials
    finally:
        rig.stop()


def test_admin_health_turns_not_serving_when_the_runtime_goes_away_under_a_kubelet_connection(
    fake_rig: ProxyRig, fake_runtime: FakeRuntime
) -> None:
    fake_rig.start()
    with fake_rig.kubelet() as k:
        k.raw("/test.Echo/Unary", b"x")
        wait_for_health(fake_rig, SERVING)
        fake_runtime.stop()
        wait_for_health(fake_rig, NOT_SERVING)
        fake_runtime.start()
        wait_for_health(fake_rig, SERVING)
