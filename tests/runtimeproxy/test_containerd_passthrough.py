"""Through the proxy, containerd answers exactly as it does directly."""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest

from apis import names
from tests.containerd.harness import Containerd
from tests.runtimeproxy import hookserver
from tests.runtimeproxy.hookserver import TestHookServer, write_hook_config
from tests.runtimeproxy.kubelet import IMAGE, RUNTIME, ContainerSpec, Kubelet, PodSpec, env_of
from tests.runtimeproxy.rig import ProxyRig

pytestmark = pytest.mark.containerd

ALLOCATION = '{"gpu":[{"minor":0,"id":"GPU-test","resources":{"koordinator.sh/gpu-core":"100"}}]}'


def _error(k: Kubelet, path: str, payload: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        k.raw(path, payload)
    return err.value


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        pytest.param(RUNTIME + "NoSuchMethodYet", b"", id="unknown method"),
        pytest.param("/runtime.v99.FutureService/Do", b"\x0a\x01x", id="unknown service"),
        pytest.param(RUNTIME + "ContainerStatus", b"\x0a\x07missing", id="NotFound"),
        pytest.param(RUNTIME + "PodSandboxStatus", b"\x0a\x07missing", id="NotFound for a sandbox"),
        pytest.param(RUNTIME + "StartContainer", b"\x0a\x07missing", id="NotFound on an intercepted-capable call"),
        pytest.param(RUNTIME + "CreateContainer", b"\x0a\x07missing", id="CreateContainer for a missing sandbox"),
    ],
)
def test_errors_come_back_with_the_same_code_and_details(
    containerd: Containerd, rig: ProxyRig, path: str, payload: bytes
) -> None:
    rig.start()
    with Kubelet(containerd.address) as direct, rig.kubelet() as proxied:
        want = _error(direct, path, payload)
        got = _error(proxied, path, payload)
    assert got.code() == want.code()
    assert got.details() == want.details()


def test_get_container_events_unimplemented_in_containerd_16_passes_through(containerd: Containerd, rig: ProxyRig) -> None:
    rig.start()
    results = []
    for k in (Kubelet(containerd.address), rig.kubelet()):
        with k:
            stream = k.channel.unary_stream(RUNTIME + "GetContainerEvents")(b"", timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                list(stream)
            results.append((err.value.code(), err.value.details()))
    assert results[0] == results[1]
    assert results[0][0] is grpc.StatusCode.UNIMPLEMENTED


def test_version_and_image_status_answer_as_directly(containerd: Containerd, rig: ProxyRig) -> None:
    rig.start()
    with Kubelet(containerd.address) as direct, rig.kubelet() as proxied:
        assert proxied.version() == direct.version()
        req = direct.m.ImageStatusRequest(image=direct.m.ImageSpec(image="fgpu.local/busybox:1"))
        want = direct.call(IMAGE + "ImageStatus", req, direct.m.ImageStatusResponse)
        got = proxied.call(IMAGE + "ImageStatus", req, proxied.m.ImageStatusResponse)
    assert got == want
    assert "fgpu.local/busybox:1" in got.image.repo_tags
    assert rig.metric("fgpu_runtime_proxy_calls_total", {"method": "RuntimeService/Version", "code": "OK"}) == 1


def test_fields_the_proxy_does_not_know_reach_containerd(gpu_rig: ProxyRig) -> None:
    with gpu_rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="unknown-fields", annotations={names.DEVICE_ALLOCATED: ALLOCATION}))
        try:
            spec = ContainerSpec(name="c", command=["/bin/sh", "-c"], args=["pwd; env"], working_dir="/tmp",
                                 envs={"PLAIN": "kept"}, future_field="from-a-newer-kubelet")
            text, _ = k.run_to_completion(pod, spec)
        finally:
            k.teardown(pod)
    # command, args, working_dir and log_path are outside the proxy's partial schema
    assert text.splitlines()[0] == "/tmp"
    env = env_of(text)
    assert env["PLAIN"] == "kept"
    assert env[names.NVIDIA_VISIBLE_DEVICES] == hookserver.gpu_value(pod.spec.uid)


def test_containerd_restart_under_a_running_proxy_needs_no_proxy_restart(containerd: Containerd, rig: ProxyRig) -> None:
    rig.start()
    with rig.kubelet() as k:
        before = k.version()
        pod = k.run_pod(PodSpec(name="survives-restart"))
        containerd.restart()
        try:
            assert k.version() == before
            assert k.sandbox_status(pod.sandbox_id).metadata.name == "survives-restart"
            text, _ = k.run_to_completion(pod, ContainerSpec(name="after", command=["echo", "hello after restart"]))
            assert text == "hello after restart"
        finally:
            k.teardown(pod)
    assert rig.metric("fgpu_runtime_proxy_backend_dials_total", {"result": "ok"}) >= 2


def test_hundred_concurrent_pods_each_get_their_own_settings(gpu_rig: ProxyRig, hook_server: TestHookServer) -> None:
    count = 100
    with gpu_rig.kubelet() as k:
        def one(i: int) -> tuple[str, str, str]:
            annotations = {names.DEVICE_ALLOCATED: ALLOCATION} if i % 2 == 0 else {}
            pod = k.run_pod(PodSpec(name=f"many-{i}", annotations=annotations))
            cid = k.create_container(pod, ContainerSpec(name="c", image="fgpu.local/cuda-like:1", command=["env"]))
            return pod.spec.uid, cid, pod.sandbox_id

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            results = list(pool.map(one, range(count)))
        try:
            for i, (uid, cid, _) in enumerate(results):
                env = dict(e.split("=", 1) for e in k.runtime_spec(cid)["process"]["env"])
                expected = hookserver.gpu_value(uid) if i % 2 == 0 else names.NVIDIA_VISIBLE_DEVICES_VOID
                assert env[names.NVIDIA_VISIBLE_DEVICES] == expected, f"pod many-{i}"
        finally:
            with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(lambda r: (k.remove_container(r[1]), k.call(
                    RUNTIME + "StopPodSandbox", k.m.PodSandboxIdRequest(pod_sandbox_id=r[2]), k.m.Empty), k.call(
                    RUNTIME + "RemovePodSandbox", k.m.PodSandboxIdRequest(pod_sandbox_id=r[2]), k.m.Empty)), results))
    assert len({cid for _, cid, _ in results}) == count
    assert hook_server.stages().count("PreCreateContainer") == count


def test_post_stage_hooks_hear_about_the_pod_from_the_runtime(rig: ProxyRig, hook_server: TestHookServer) -> None:
    write_hook_config(rig.hook_dir, name="observer", endpoint=hook_server.endpoint, policy="Ignore",
                      stages=["PostStartContainer", "PostStopContainer", "PostStopPodSandbox",
                              "PreUpdateContainerResources", "PreRunPodSandbox"])
    rig.start()
    with rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="observed", namespace="team-a"))
        cid = k.create_container(pod, ContainerSpec(name="sleeper", command=["sleep", "30"]))
        k.start_container(cid)
        k.update_resources(cid, cpu_shares=512)
        k.stop_container(cid)
        k.remove_container(cid)
        k.teardown(pod)
    _wait_for(lambda: {"PostStartContainer", "PostStopContainer", "PostStopPodSandbox"} <= set(hook_server.stages()))
    for stage in ("PostStartContainer", "PostStopContainer", "PreUpdateContainerResources"):
        (req,) = hook_server.requests(stage)
        assert (req.pod.namespace, req.pod.name, req.pod.uid) == ("team-a", "observed", pod.spec.uid)
        assert (req.container.name, req.container.id) == ("sleeper", cid)
    (update,) = hook_server.requests("PreUpdateContainerResources")
    assert update.resources.cpu_shares == 512
    (sandbox_run,) = hook_server.requests("PreRunPodSandbox")
    assert sandbox_run.pod.uid == pod.spec.uid
    (sandbox_stop,) = hook_server.requests("PostStopPodSandbox")
    assert sandbox_stop.pod.sandbox_id == pod.sandbox_id


def _wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    import time

    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
