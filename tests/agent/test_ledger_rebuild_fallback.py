"""An agent restarted while the Kubernetes API is down rebuilds its admission ledger from the container runtime."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

import grpc
import pytest

from agent import podsources
from agent.admissions import Hold
from agent.config import AgentConfig
from agent.criclient import RuntimeClient
from agent.daemon import Agent
from agent.discovery import discover
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.kube import Kube
from agent.pcitopology import InventoryTopology
from agent.podsources import RuntimePods
from apis.allocation import Allocation, ContainerShare, GPUShare
from apis.devices import NodeDevices
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from apis.signing import allocation_annotations
from tests.agent.helpers import T4, started_fake
from tests.containerd.fixtures import containerd  # noqa: F401 - a fixture
from tests.containerd.harness import Containerd
from tests.kubeapi import KubeAPIServer
from tests.runtimeproxy.kubelet import ContainerSpec, Kubelet, Pod, PodSpec
from tests.signing_keys import signing_key, write_verifying_keys
from tests.waiting import wait_until as _wait

KEY = signing_key("ledger-fallback-test-key")
NODE = "gpu-node-1"
GiB = 2**30


def _t4_devices() -> NodeDevices:
    nvml, inventory = started_fake(T4)
    return discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices


T4_DEVICES = _t4_devices()
GPU0 = T4_DEVICES.gpus[0].uuid


def _share(index: int, core: int) -> GPUShare:
    gpu = T4_DEVICES.gpus[index]
    return GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=core, memory_bytes=4 * GiB, memory_ratio_percent=25,
        containers=(ContainerShare("main", core, 4 * GiB, 25),),
    )


def _signed(uid: str, *shares: GPUShare) -> dict[str, str]:
    return allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=shares))


def _request(uid: str, annotations: dict[str, str]) -> hooks_pb2.ContainerHookRequest:
    return hooks_pb2.ContainerHookRequest(
        pod=hooks_pb2.PodSandboxMeta(name=f"pod-{uid}", namespace="ml", uid=uid, annotations=annotations),
        container=hooks_pb2.ContainerMeta(name="main"),
    )


def _api_pod(pod: Pod) -> dict[str, object]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod.spec.name, "namespace": pod.spec.namespace, "uid": pod.spec.uid,
                     "annotations": pod.spec.annotations},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "main", "containerID": "containerd://x"}]},
    }


@pytest.fixture
def running(containerd: Containerd) -> Iterator[Pod]:  # noqa: F811 - the fixture above
    """A pod with a created container in the real containerd, signed for 60% of GPU 0."""
    with Kubelet(containerd.address) as kubelet:
        spec = PodSpec(name="holds-gpu0", namespace="ml")
        spec.annotations = _signed(spec.uid, _share(0, 60))
        pod = kubelet.run_pod(spec)
        try:
            kubelet.create_container(pod, ContainerSpec(name="main", command=["sleep", "3600"]))
            yield pod
        finally:
            with contextlib.suppress(grpc.RpcError):
                kubelet.teardown(pod)


@pytest.fixture
def workdir() -> Iterator[str]:
    # Short: a unix socket path must fit in 108 bytes.
    tmp = tempfile.mkdtemp(prefix="fgpu-lfb-")
    write_verifying_keys(os.path.join(tmp, "verifying-keys"), KEY)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _agent(kube_api: KubeAPIServer, tmp: str, runtime_endpoint: str) -> Agent:
    config = AgentConfig(
        node_name=NODE,
        report_to_kubernetes=True,
        runtime_endpoint=runtime_endpoint,
        hook_listen=f"unix://{tmp}/hooks.sock",
        verifying_keys=os.path.join(tmp, "verifying-keys"),
        metrics_listen="",
        admission_sweep_s=0.05,
        admission_sweep_grace_s=600.0,
        checkpoint_path=os.path.join(tmp, "no-checkpoint"),
        proc_root=os.path.join(tmp, "proc"),
    )
    inventory = load_inventory(T4)
    return Agent(
        config, node_name=NODE, nvml=FakeNVML(inventory), topology=InventoryTopology(inventory),
        kube=Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=1.0),
    )


def test_an_agent_restarted_while_the_api_is_down_counts_the_runtimes_pods_and_admits_onto_the_free_share(
    containerd: Containerd, running: Pod, kube_api: KubeAPIServer, workdir: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The client would retry a hung API four times (4 s here, 40 s as deployed); the agent waits less.
    monkeypatch.setattr(podsources, "API_WAIT_S", 0.5)
    uid = running.spec.uid
    kube_api.put_object("/api/v1/namespaces/ml/pods", _api_pod(running))
    agent = _agent(kube_api, workdir, containerd.address)
    kube_api.pause()
    resumed = False
    channel = grpc.insecure_channel(f"unix://{workdir}/hooks.sock")
    hook = hooks_pb2_grpc.RuntimeHooksStub(channel)  # type: ignore[no-untyped-call]
    try:
        with caplog.at_level(logging.INFO, logger="agent"):
            agent.start()  # the API does not answer in 0.5 s; the runtime does
        assert agent.ledger.pods() == {uid: (Hold(GPU0, 60, 4 * GiB),)}
        restored = [r.getMessage() for r in caplog.records if "admission ledger restored" in r.getMessage()]
        assert len(restored) == 1 and f"container runtime at {containerd.address}" in restored[0], restored
        assert "Kubernetes API" in restored[0] and "did not answer within 0.5s" in restored[0], restored[0]
        # GPU admissions resume: the free 40% of GPU 0 is given, a pod that would double-book it is not.
        fits = hook.PreCreateContainer(_request("fits", _signed("fits", _share(0, 40))), timeout=5)
        assert not fits.HasField("rejection"), fits.rejection.reason
        over = hook.PreCreateContainer(_request("over", _signed("over", _share(0, 10))), timeout=5)
        assert f"GPU {GPU0}" in over.rejection.reason
        assert "already admitted on this node" in over.rejection.reason and uid in over.rejection.reason
        # The API back: the sweep lists it again and keeps what runs (the pod restored from the runtime,
        # the one admitted since), well inside the grace.
        loop = agent.sweep_loop
        assert loop is not None
        kube_api.resume()
        resumed = True
        passes = loop.passes
        _wait(lambda: loop.passes > passes + 1)
        assert set(agent.ledger.pods()) == {uid, "fits"}
    finally:
        channel.close()
        if not resumed:
            kube_api.resume()
        agent.stop(2)


def test_while_neither_the_api_nor_the_runtime_answers_gpu_allocations_wait_and_resume_once_the_runtime_does(
    containerd: Containerd, running: Pod, kube_api: KubeAPIServer, workdir: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(podsources, "API_WAIT_S", 0.2)
    # The endpoint is a link made only later: until then the runtime is "down".
    endpoint = os.path.join(workdir, "cri.sock")
    agent = _agent(kube_api, workdir, f"unix://{endpoint}")
    kube_api.pause()
    channel = grpc.insecure_channel(f"unix://{workdir}/hooks.sock")
    hook = hooks_pb2_grpc.RuntimeHooksStub(channel)  # type: ignore[no-untyped-call]
    try:
        agent.start()
        assert agent.rebuilder is not None and agent.rebuilder.pending and agent.ledger.pods() == {}
        over = _request("over", _signed("over", _share(0, 50)))
        waiting = hook.PreCreateContainer(over, timeout=5)
        assert "not yet restored" in waiting.rejection.reason
        plain = hook.PreCreateContainer(_request("plain", {}), timeout=5)
        assert not plain.HasField("rejection")
        os.symlink(containerd.socket_path, endpoint)
        _wait(lambda: agent.rebuilder is not None and not agent.rebuilder.pending)
        assert agent.ledger.pods() == {running.spec.uid: (Hold(GPU0, 60, 4 * GiB),)}
        # kubelet's retry: refused now for the right reason, with the API still down.
        assert "already admitted on this node" in hook.PreCreateContainer(over, timeout=5).rejection.reason
    finally:
        channel.close()
        kube_api.resume()
        agent.stop(2)


def test_the_runtime_says_which_pods_have_a_container_created(
    containerd: Containerd, running: Pod,  # noqa: F811
) -> None:
    runtime = RuntimeClient(containerd.address, request_timeout_s=5.0)
    with Kubelet(containerd.address) as kubelet:
        bare = kubelet.run_pod(PodSpec(name="no-container-yet", namespace="ml"))
        try:
            seen = {p.uid: p for p in RuntimePods(runtime, node_name=NODE).list_pods()}
        finally:
            kubelet.teardown(bare)
            runtime.close()
    assert (seen[running.spec.uid].started, seen[bare.spec.uid].started) == (True, False)
