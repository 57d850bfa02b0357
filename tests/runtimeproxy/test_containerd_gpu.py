"""End to end through the proxy into a real containerd: GPU settings reach the container, or it does not start."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc
import pytest

from apis import names
from tests.runtimeproxy import hookserver
from tests.runtimeproxy.hookserver import TestHookServer, write_hook_config
from tests.runtimeproxy.kubelet import ContainerSpec, PodSpec, env_of
from tests.runtimeproxy.rig import ProxyRig

pytestmark = pytest.mark.containerd

T = TypeVar("T")

ALLOCATION = '{"gpu":[{"minor":0,"id":"GPU-test","resources":{"koordinator.sh/gpu-core":"50"}}]}'


def test_gpu_pod_container_sees_hook_env_mount_and_device(gpu_rig: ProxyRig) -> None:
    with gpu_rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="gpu-pod", annotations={names.DEVICE_ALLOCATED: ALLOCATION}))
        try:
            spec = ContainerSpec(
                name="main",
                image="fgpu.local/cuda-like:1",
                command=["/bin/sh", "-c", f"env; cat {hookserver.MOUNT_PATH}/{hookserver.MARKER_FILE}; "
                         f"test -c {hookserver.DEVICE_PATH} && echo device-present"],
            )
            text, status = k.run_to_completion(pod, spec)
        finally:
            k.teardown(pod)
    env = env_of(text)
    assert status.exit_code == 0, text
    assert env[names.NVIDIA_VISIBLE_DEVICES] == hookserver.gpu_value(pod.spec.uid)
    assert env[names.HAMI_SM_LIMIT] == hookserver.SM_LIMIT
    assert env[names.HAMI_MEMORY_LIMIT_PREFIX + "0"] == hookserver.MEMORY_LIMIT
    assert hookserver.MARKER in text
    assert "device-present" in text


def test_pod_without_allocation_sees_void_over_the_images_all(gpu_rig: ProxyRig, hook_server: TestHookServer) -> None:
    with gpu_rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="cpu-pod"))
        try:
            text, _ = k.run_to_completion(pod, ContainerSpec(name="main", image="fgpu.local/cuda-like:1", command=["env"]))
        finally:
            k.teardown(pod)
    assert env_of(text)[names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID
    assert names.HAMI_SM_LIMIT not in env_of(text)
    assert gpu_rig.metric("fgpu_runtime_proxy_forced_void_total") >= 1
    assert hook_server.stages().count("PreCreateContainer") == 1


def test_pod_spec_cannot_grant_itself_gpus_through_env(gpu_rig: ProxyRig) -> None:
    with gpu_rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="sneaky-pod"))
        try:
            spec = ContainerSpec(name="main", command=["env"], envs={names.NVIDIA_VISIBLE_DEVICES: "all", "KEEP": "me"})
            text, _ = k.run_to_completion(pod, spec)
        finally:
            k.teardown(pod)
    env = env_of(text)
    assert env[names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID
    assert env["KEEP"] == "me"


def test_gpu_pod_fails_closed_while_hook_is_down_and_retry_succeeds_once_it_is_back(
    gpu_rig: ProxyRig, hook_server: TestHookServer
) -> None:
    hook_server.stop()
    with gpu_rig.kubelet() as k:
        gpu_pod = k.run_pod(PodSpec(name="gpu-pod-retry", annotations={names.DEVICE_ALLOCATED: ALLOCATION}))
        cpu_pod = k.run_pod(PodSpec(name="cpu-pod-while-hook-down"))
        try:
            spec = ContainerSpec(name="main", image="fgpu.local/cuda-like:1", command=["env"])
            with pytest.raises(grpc.RpcError) as err:
                k.create_container(gpu_pod, spec)
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "GPU allocation" in err.value.details()
            assert "test-gpu-hook" in err.value.details()

            text, _ = k.run_to_completion(cpu_pod, ContainerSpec(name="main", image="fgpu.local/cuda-like:1", command=["env"]))
            assert env_of(text)[names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID

            hook_server.start()
            text = _retry(lambda: k.run_to_completion(gpu_pod, spec)[0])
            assert env_of(text)[names.NVIDIA_VISIBLE_DEVICES] == hookserver.gpu_value(gpu_pod.spec.uid)
        finally:
            k.teardown(gpu_pod)
            k.teardown(cpu_pod)
    assert gpu_rig.metric("fgpu_runtime_proxy_refused_total", {"method": "CreateContainer", "reason": "hooks"}) >= 1


def test_gpu_pod_is_refused_when_no_hook_server_is_registered(rig: ProxyRig) -> None:
    rig.start()
    with rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="gpu-pod-no-hook", annotations={names.DEVICE_ALLOCATED: ALLOCATION}))
        try:
            with pytest.raises(grpc.RpcError) as err:
                k.create_container(pod, ContainerSpec(name="main", command=["env"]))
        finally:
            k.teardown(pod)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "no hook server is registered for PreCreateContainer" in err.value.details()


def test_hook_rejection_refuses_the_container_with_the_hooks_reason(gpu_rig: ProxyRig, hook_server: TestHookServer) -> None:
    hook_server.behaviour.reject = "allocation signature does not match this node"
    with gpu_rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="gpu-pod-rejected", annotations={names.DEVICE_ALLOCATED: ALLOCATION}))
        try:
            with pytest.raises(grpc.RpcError) as err:
                k.create_container(pod, ContainerSpec(name="main", command=["env"]))
        finally:
            k.teardown(pod)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "allocation signature does not match this node" in err.value.details()


def test_hook_server_pod_bypasses_hooks_and_void(gpu_rig: ProxyRig, hook_server: TestHookServer) -> None:
    hook_server.stop()
    spec = PodSpec(name="fgpu-agent-x", namespace="fgpu-system", labels={names.HOOK_SERVER_LABEL: "true"})
    with gpu_rig.kubelet() as k:
        pod = k.run_pod(spec)
        try:
            text, _ = k.run_to_completion(pod, ContainerSpec(name="agent", image="fgpu.local/cuda-like:1", command=["env"]))
        finally:
            k.teardown(pod)
    assert env_of(text)[names.NVIDIA_VISIBLE_DEVICES] == "all"


def test_hook_server_label_outside_allowed_namespaces_is_not_honoured(gpu_rig: ProxyRig) -> None:
    spec = PodSpec(name="pretender", namespace="default", labels={names.HOOK_SERVER_LABEL: "true"})
    with gpu_rig.kubelet() as k:
        pod = k.run_pod(spec)
        try:
            text, _ = k.run_to_completion(pod, ContainerSpec(name="c", image="fgpu.local/cuda-like:1", command=["env"]))
        finally:
            k.teardown(pod)
    assert env_of(text)[names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID


def test_ignore_policy_hook_down_lets_pods_without_allocation_run(rig: ProxyRig, hook_server: TestHookServer) -> None:
    write_hook_config(rig.hook_dir, name="optional-hook", endpoint=hook_server.endpoint,
                      stages=["PreCreateContainer"], policy="Ignore")
    rig.start()
    hook_server.stop()
    with rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="cpu-pod-ignore"))
        try:
            text, status = k.run_to_completion(pod, ContainerSpec(name="c", command=["env"]))
        finally:
            k.teardown(pod)
    assert status.exit_code == 0
    assert env_of(text)[names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID
    assert rig.metric("fgpu_runtime_proxy_hook_errors_total",
                      {"server": "optional-hook", "stage": "PreCreateContainer", "reason": "unavailable"}) == 1


def test_fail_policy_hook_down_refuses_even_pods_without_allocation(rig: ProxyRig, hook_server: TestHookServer) -> None:
    write_hook_config(rig.hook_dir, name="strict-hook", endpoint=hook_server.endpoint,
                      stages=["PreCreateContainer"], policy="Fail")
    rig.start()
    hook_server.stop()
    with rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="cpu-pod-strict"))
        try:
            with pytest.raises(grpc.RpcError) as err:
                k.create_container(pod, ContainerSpec(name="c", command=["env"]))
        finally:
            k.teardown(pod)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "'strict-hook' failed" in err.value.details()
    assert "failurePolicy is Fail" in err.value.details()


def _retry(fn: Callable[[], T], *, attempts: int = 30, pause_s: float = 0.2) -> T:
    """Calls `fn` until it stops raising grpc.RpcError, as kubelet's sync loop would."""
    for _ in range(attempts - 1):
        try:
            return fn()
        except grpc.RpcError:
            time.sleep(pause_s)
    return fn()
