"""The relay against a recording fake runtime: what crosses the proxy, byte for byte."""

from __future__ import annotations

import concurrent.futures
import os
import tempfile
import time

import grpc
import pytest

from apis import names
from tests.runtimeproxy import hookserver
from tests.runtimeproxy.fakeruntime import CREATE_CONTAINER, FakeRuntime
from tests.runtimeproxy.hookserver import TestHookServer, write_hook_config
from tests.runtimeproxy.kubelet import ContainerSpec, Kubelet, Pod, PodSpec
from tests.runtimeproxy.rig import ProxyRig

ALLOCATION = '{"gpu":[{"minor":0,"id":"GPU-x","resources":{"koordinator.sh/gpu-core":"100"}}]}'


def _pod(k: Kubelet, **kw: object) -> Pod:
    spec = PodSpec(name="p", **kw)  # type: ignore[arg-type]
    return Pod(spec=spec, sandbox_id="sandbox-1", config=k.pod_config(spec), log_dir="/tmp")


def test_request_and_response_bytes_cross_unchanged(fake_rig: ProxyRig, fake_runtime: FakeRuntime) -> None:
    fake_rig.start()
    payload = bytes(range(256)) * 10
    with fake_rig.kubelet() as k:
        got, _ = k.raw("/test.Echo/Unary", payload)
    assert fake_runtime.last("/test.Echo/Unary").request == payload
    assert got == payload


def test_metadata_passes_both_ways(fake_rig: ProxyRig) -> None:
    fake_rig.start()
    with fake_rig.kubelet() as k:
        _, call = k.raw("/test.Echo/Unary", b"x", metadata=(("x-echo", "v1"),))
    assert ("x-echo", "v1") in call.initial_metadata()
    assert ("x-echo-trailer", "v1") in call.trailing_metadata()


@pytest.mark.parametrize("code", ["NOT_FOUND", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED", "INTERNAL"])
def test_status_code_and_details_are_those_of_the_runtime(fake_rig: ProxyRig, fake_runtime: FakeRuntime, code: str) -> None:
    fake_rig.start()
    details = "container \u201cc1\u201d: 100% gone"
    errors = []
    for address in (fake_runtime.address, fake_rig.listen):
        with Kubelet(address) as k, pytest.raises(grpc.RpcError) as err:
            k.raw("/test.Echo/Fail", details.encode(), metadata=(("x-code", code),))
        errors.append((err.value.code(), err.value.details()))
    assert errors[0] == errors[1] == (grpc.StatusCode[code], details)


#: grpcio keeps deadlines on the monotonic clock and reports them on the wall clock; each conversion reads
#: both clocks one after the other, so a loaded machine that preempts between the reads moves a deadline by
#: that long (9 ms seen), in either direction, on each side
CLOCK_SLACK = 0.1


def test_deadline_reaches_the_runtime(fake_rig: ProxyRig, fake_runtime: FakeRuntime) -> None:
    fake_rig.start()
    timeout = 1.5
    with fake_rig.kubelet() as k, pytest.raises(grpc.RpcError) as err:
        sent_at = time.time()
        k.raw("/test.Echo/Wait", b"", timeout=timeout)
    assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    seen = fake_runtime.last("/test.Echo/Wait")
    assert seen.time_remaining is not None
    # gRPC sends time left, not a point in time: the runtime's deadline is kubelet's, moved later by the
    # time the request took to get there (the proxy's latency), never earlier, and never more time left
    # than kubelet gave (not dropped, not extended by the proxy, not cut to a proxy deadline of its own)
    assert seen.time_remaining <= timeout + CLOCK_SLACK
    assert seen.at + seen.time_remaining >= sent_at + timeout - CLOCK_SLACK


def test_no_deadline_stays_no_deadline(fake_rig: ProxyRig, fake_runtime: FakeRuntime) -> None:
    fake_rig.start()
    with fake_rig.kubelet() as k:
        k.channel.unary_unary("/test.Echo/Unary")(b"x")
    remaining = fake_runtime.last("/test.Echo/Unary").time_remaining
    # grpcio reports "no deadline" as an enormous remaining time
    assert remaining is None or remaining > 86400 * 365


def test_cancellation_reaches_the_runtime(fake_rig: ProxyRig, fake_runtime: FakeRuntime) -> None:
    fake_rig.start()
    with fake_rig.kubelet() as k:
        future = k.channel.unary_unary("/test.Echo/Wait").future(b"")
        deadline = time.monotonic() + 5
        while not any(s.method == "/test.Echo/Wait" for s in fake_runtime.seen) and time.monotonic() < deadline:
            time.sleep(0.01)
        future.cancel()
        assert fake_runtime.cancelled.wait(5)


def test_server_streaming_passes_every_message(fake_rig: ProxyRig) -> None:
    fake_rig.start()
    with fake_rig.kubelet() as k:
        messages = list(k.channel.unary_stream("/test.Echo/Stream")(b"500", timeout=10))
    assert messages == [str(i).encode() for i in range(500)]


def test_messages_up_to_kubelets_16_mib_limit_pass(fake_rig: ProxyRig) -> None:
    fake_rig.start()
    payload = os.urandom(15 * 1024 * 1024)
    with fake_rig.kubelet() as k:
        got, _ = k.raw("/test.Echo/Unary", payload)
    assert got == payload


def test_intercepted_call_keeps_fields_the_proxy_does_not_know(fake_rig: ProxyRig, fake_runtime: FakeRuntime) -> None:
    fake_rig.start()
    with fake_rig.kubelet() as k:
        req = k.create_container_request(_pod(k), ContainerSpec(name="c", command=["run"], working_dir="/w",
                                                               future_field="future value"))
        k.raw(CREATE_CONTAINER, req.SerializeToString())
        got = k.m.CreateContainerRequest.FromString(fake_runtime.last(CREATE_CONTAINER).request)
    assert got.config.fgpu_future_field == "future value"
    assert got.config.working_dir == "/w"
    assert list(got.config.command) == ["run"]
    assert got.config.log_path == req.config.log_path
    assert [(e.key, e.value) for e in got.config.envs] == [(names.NVIDIA_VISIBLE_DEVICES, b"void")]
    future_tag = b"\x92\x89\x02"  # field 4242, wire type 2
    assert future_tag + bytes([len("future value")]) + b"future value" in fake_runtime.last(CREATE_CONTAINER).request


def test_intercepted_call_with_nothing_to_change_reaches_the_runtime_byte_for_byte(
    fake_rig: ProxyRig, fake_runtime: FakeRuntime
) -> None:
    fake_rig.start(force_void=False)
    with fake_rig.kubelet() as k:
        req = k.create_container_request(_pod(k), ContainerSpec(name="c", future_field="x"))
        payload = req.SerializeToString()
        got, _ = k.raw(CREATE_CONTAINER, payload)
    assert fake_runtime.last(CREATE_CONTAINER).request == payload
    assert got == b"\x0a\x04fake"


@pytest.mark.parametrize(("count", "env_vars"), [(20, 1000), (4, 50_000)], ids=["20x100KB", "4x5MB"])
def test_large_intercepted_requests_flow_past_the_runtimes_windows(
    fake_rig: ProxyRig, fake_runtime: FakeRuntime, count: int, env_vars: int
) -> None:
    fake_rig.start()
    with fake_rig.kubelet() as k:
        # bigger than the runtime's stream window (64 KiB for Go, 4 MiB for grpc-core), and the proxy
        # makes each one bigger still, so its sends wait for the runtime's WINDOW_UPDATEs
        envs = {f"VAR_{i}": "x" * 100 for i in range(env_vars)}
        payloads = [
            k.create_container_request(_pod(k, uid=f"uid-{n}"), ContainerSpec(name=f"c{n}", envs=envs)).SerializeToString()
            for n in range(count)
        ]
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda p: k.raw(CREATE_CONTAINER, p)[0], payloads))
        # and the connection still carries plain calls afterwards
        echoed, _ = k.raw("/test.Echo/Unary", os.urandom(300_000))
    assert answers == [b"\x0a\x04fake"] * count
    assert len(echoed) == 300_000
    seen = [k.m.CreateContainerRequest.FromString(s.request) for s in fake_runtime.seen if s.method == CREATE_CONTAINER]
    assert sorted(s.sandbox_config.metadata.uid for s in seen) == sorted(f"uid-{n}" for n in range(count))
    assert all(len(s.config.envs) == env_vars + 1 for s in seen)


def test_refused_calls_leave_the_connection_usable(fake_rig: ProxyRig, fake_runtime: FakeRuntime) -> None:
    fake_rig.start()  # no hook server registered: GPU containers are refused
    with fake_rig.kubelet() as k:
        gpu = k.create_container_request(_pod(k, annotations={names.DEVICE_ALLOCATED: ALLOCATION}), ContainerSpec(name="g"))

        def refused(_: int) -> grpc.StatusCode:
            with pytest.raises(grpc.RpcError) as err:
                k.raw(CREATE_CONTAINER, gpu.SerializeToString(), metadata=(("x-n", str(_)),))
            code: grpc.StatusCode = err.value.code()
            return code

        def echoed(i: int) -> bytes:
            got, _ = k.raw("/test.Echo/Unary", str(i).encode(), metadata=(("x-echo", f"v{i}"),))
            return got

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            codes = list(pool.map(refused, range(50)))
            echoes = list(pool.map(echoed, range(200)))
    assert set(codes) == {grpc.StatusCode.UNAVAILABLE}
    assert echoes == [str(i).encode() for i in range(200)]
    assert not any(s.method == CREATE_CONTAINER for s in fake_runtime.seen)


def test_runtime_down_gives_a_clear_error_and_recovers_without_restart(fake_rig: ProxyRig, fake_runtime: FakeRuntime) -> None:
    fake_runtime.stop()
    fake_rig.backend_dial_timeout_s = 0.3
    fake_rig.start()
    with fake_rig.kubelet() as k:
        with pytest.raises(grpc.RpcError) as err:
            k.raw("/test.Echo/Unary", b"x")
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        fake_runtime.start()
        deadline = time.monotonic() + 10
        while True:
            try:
                got, _ = k.raw("/test.Echo/Unary", b"back", timeout=2)
                break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    # the refusal is the proxy's own, naming the runtime it could not reach, not a bare transport error
    details = err.value.details() or ""
    assert f"the container runtime at {fake_runtime.address} is unreachable" in details, details
    assert details.startswith("fgpu-runtime-proxy: "), details
    assert got == b"back"


def test_runtime_slow_to_come_back_is_waited_for(fake_rig: ProxyRig, fake_runtime: FakeRuntime) -> None:
    fake_runtime.stop()
    fake_rig.backend_dial_timeout_s = 5.0
    fake_rig.start()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool, fake_rig.kubelet() as k:
        pending = pool.submit(k.raw, "/test.Echo/Unary", b"patient", timeout=10)
        time.sleep(0.5)
        fake_runtime.start()
        got, _ = pending.result()
    assert got == b"patient"


def test_tempdir_is_short_enough_for_unix_sockets() -> None:
    assert len(os.path.join(tempfile.gettempdir(), "fgpu-proxy-xxxxxxxx", "admin.sock")) < 100


def test_a_hook_registered_while_the_proxy_runs_is_used_for_the_next_container(
    fake_rig: ProxyRig, fake_runtime: FakeRuntime, hook_server: TestHookServer
) -> None:
    fake_rig.start()
    with fake_rig.kubelet() as k:
        gpu = k.create_container_request(_pod(k, annotations={names.DEVICE_ALLOCATED: ALLOCATION}), ContainerSpec(name="g"))
        with pytest.raises(grpc.RpcError) as err:
            k.raw(CREATE_CONTAINER, gpu.SerializeToString())
        assert "no hook server is registered" in (err.value.details() or "")
        write_hook_config(fake_rig.hook_dir, name="late-hook", endpoint=hook_server.endpoint,
                          stages=["PreCreateContainer"], policy="Ignore")
        fake_rig.reload_hooks()
        k.raw(CREATE_CONTAINER, gpu.SerializeToString())
        got = k.m.CreateContainerRequest.FromString(fake_runtime.last(CREATE_CONTAINER).request)
    env = {e.key: e.value.decode() for e in got.config.envs}
    assert env[names.NVIDIA_VISIBLE_DEVICES] == hookserver.gpu_value(gpu.sandbox_config.metadata.uid)
    assert [m.container_path for m in got.config.mounts] == [hookserver.MOUNT_PATH]
    assert [(d.container_path, d.host_path) for d in got.config.devices] == [(hookserver.DEVICE_PATH, "/dev/null")]
