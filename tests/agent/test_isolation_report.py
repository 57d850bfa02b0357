"""A node whose isolation backend cannot work says so: its FgpuIsolationReady condition (kubelet's conditions
untouched), an Event on the Node when the verdict changes, the fgpu_agent_isolation_ready metric; and the
running agent's hook rejects shares there. Against the Kubernetes API double through the official client."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.backendcheck import CONDITION_TYPE
from agent.backendreport import RECHECK_NOT_READY_S, IsolationMonitor
from agent.isolation.registry import IsolationPaths
from agent.kube import Kube
from agent.metrics import AgentMetrics
from apis import names
from tests.agent.test_backendcheck import PRELOAD_OK, X86, FakeFiles, elf
from tests.kubeapi import KubeAPIServer

NODE = "gpu-node-1"
PATHS = IsolationPaths()
KUBELET_READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def kube(kube_api: KubeAPIServer) -> Iterator[Kube]:
    kube_api.put_object("/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "status": {"conditions": [KUBELET_READY]},
    })
    client = Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=2.0)
    yield client
    client.close()


def _monitor(kube: Kube | None, files: FakeFiles, metrics: AgentMetrics, clock: Clock | None = None) -> IsolationMonitor:
    return IsolationMonitor(
        node_name=NODE, isolation=names.ISOLATION_HAMI_CORE, paths=PATHS, metrics=metrics, kube=kube, files=files, machine=X86,
        clock=clock or Clock(), now=lambda: datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC),
    )


def _conditions(api: KubeAPIServer) -> dict[str, dict[str, str]]:
    node = api.get_object(f"/api/v1/nodes/{NODE}") or {}
    return {c["type"]: c for c in node.get("status", {}).get("conditions", [])}


def _events(api: KubeAPIServer) -> list[tuple[str, str, str]]:
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(config_file=api.kubeconfig_path))
    return [(e.type, e.reason, e.involved_object.name) for e in core.list_namespaced_event("default").items]


def _metric(metrics: AgentMetrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value("fgpu_agent_isolation_ready", {"isolation": "hami-core", "reason": reason})


def test_a_missing_library_sets_the_condition_false_posts_a_warning_and_zeroes_the_metric(
    kube_api: KubeAPIServer, kube: Kube
) -> None:
    metrics = AgentMetrics()
    _monitor(kube, FakeFiles(), metrics).report()
    conditions = _conditions(kube_api)
    assert conditions["Ready"] == KUBELET_READY  # merged by type: kubelet's conditions stay
    mine = conditions[CONDITION_TYPE]
    assert (mine["status"], mine["reason"]) == ("False", "LibraryMissing")
    assert "/usr/local/vgpu/libvgpu.so cannot be read" in mine["message"]
    assert _events(kube_api) == [("Warning", "IsolationNotReady", NODE)]
    assert _metric(metrics, "LibraryMissing") == 0


def test_the_library_arriving_flips_the_condition_posts_ready_once_and_moves_the_metric(
    kube_api: KubeAPIServer, kube: Kube
) -> None:
    files, metrics = FakeFiles(), AgentMetrics()
    monitor = _monitor(kube, files, metrics)
    monitor.report()
    files.files.update({PATHS.hami_library: elf(), PATHS.hami_preload: PRELOAD_OK})
    monitor.report()
    monitor.report()  # nothing changed: no write, no Event
    mine = _conditions(kube_api)[CONDITION_TYPE]
    assert (mine["status"], mine["reason"]) == ("True", "Ready")
    assert sorted(_events(kube_api)) == [("Normal", "IsolationReady", NODE), ("Warning", "IsolationNotReady", NODE)]
    assert _metric(metrics, "Ready") == 1
    assert _metric(metrics, "LibraryMissing") is None  # one series at a time


def test_a_healthy_start_writes_the_condition_without_an_event(kube_api: KubeAPIServer, kube: Kube) -> None:
    _monitor(kube, FakeFiles({PATHS.hami_library: elf(), PATHS.hami_preload: PRELOAD_OK}), AgentMetrics()).report()
    assert _conditions(kube_api)[CONDITION_TYPE]["status"] == "True"
    assert _events(kube_api) == []


def test_the_hook_sees_a_fixed_node_without_waiting_for_the_next_report_pass() -> None:
    files, clock = FakeFiles(), Clock()
    monitor = _monitor(None, files, AgentMetrics(), clock)
    assert monitor.refresh().problem
    files.files.update({PATHS.hami_library: elf(), PATHS.hami_preload: PRELOAD_OK})
    assert monitor.current().problem  # the recent verdict stands
    clock.t += RECHECK_NOT_READY_S
    assert monitor.current().problem == ""


def test_the_running_agent_refuses_a_share_its_backend_cannot_enforce_and_says_so_on_the_node(
    kube_api: KubeAPIServer, kube: Kube, tmp_path: Path
) -> None:
    import time

    import grpc

    from agent.config import AgentConfig
    from agent.daemon import Agent
    from agent.fakenvml import FakeNVML
    from agent.fakenvml_inventory import load_inventory
    from agent.pcitopology import InventoryTopology
    from apis import names
    from apis.allocation import Allocation, ContainerShare, GPUShare
    from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
    from apis.signing import allocation_annotations
    from tests.agent.helpers import T4
    from tests.kubeapi import DEVICE_CRD
    from tests.signing_keys import signing_key, write_verifying_keys

    kube_api.install_crd(DEVICE_CRD)
    key = signing_key("isolation-test")
    inventory = load_inventory(T4)
    config = AgentConfig(
        node_name=NODE, hook_listen=f"unix://{tmp_path}/hooks.sock",
        verifying_keys=write_verifying_keys(f"{tmp_path}/keys", key), metrics_listen="",
        poll_interval_s=0.05, discovery_interval_s=1.0, report_resync_s=0.2,
        checkpoint_path=f"{tmp_path}/no-checkpoint", proc_root=f"{tmp_path}/proc",
    )
    agent = Agent(config, node_name=NODE, nvml=FakeNVML(inventory), topology=InventoryTopology(inventory),
                  kube=kube, isolation_files=FakeFiles())
    agent.start()
    try:
        deadline = time.monotonic() + 15
        while not agent.state.devices().gpus or CONDITION_TYPE not in _conditions(kube_api):
            assert time.monotonic() < deadline, "the agent never wrote its isolation condition"
            time.sleep(0.05)
        gpu = agent.state.devices().gpus[0]
        share = GPUShare(minor=gpu.minor, uuid=gpu.uuid, core_percent=50, memory_bytes=2**30, memory_ratio_percent=0,
                         containers=(ContainerShare("main", 50, 2**30, 0),))
        annotations = allocation_annotations(key, pod_uid="u1", node_name=NODE, allocation=Allocation(gpus=(share,)))
        with grpc.insecure_channel(f"unix://{tmp_path}/hooks.sock") as channel:
            stub = hooks_pb2_grpc.RuntimeHooksStub(channel)  # type: ignore[no-untyped-call]
            response = stub.PreCreateContainer(hooks_pb2.ContainerHookRequest(
                pod=hooks_pb2.PodSandboxMeta(uid="u1", name="p", namespace="ml", annotations=annotations),
                container=hooks_pb2.ContainerMeta(name="main"),
            ), timeout=5)
        assert "cannot enforce a GPU share now" in response.rejection.reason
        assert "libvgpu.so cannot be read" in response.rejection.reason
        assert _conditions(kube_api)[CONDITION_TYPE]["status"] == "False"
        assert agent.metrics.registry.get_sample_value(
            "fgpu_agent_isolation_ready", {"isolation": "hami-core", "reason": "LibraryMissing"}
        ) == 0
        assert names.DEVICE_ALLOCATED in annotations
    finally:
        agent.stop(2)
