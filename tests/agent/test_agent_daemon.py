"""The whole agent in one process: fake NVML, the Kubernetes API double, a scheduler stand-in, the hook socket."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.kube import Kube
from agent.pcitopology import InventoryTopology
from agent.schedclient import SchedulerReporter
from apis import names
from apis.devices import NodeDevices, from_device_object, from_proto
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.agent.helpers import T4
from tests.kubeapi import DEVICE_CRD, KubeAPIServer
from tests.signing_keys import signing_key, write_verifying_keys
from tests.waiting import wait_until as _wait

NODE = "gpu-node-1"
DEVICE_PATH = f"/apis/{names.DEVICE_GROUP}/{names.DEVICE_VERSION}/devices/{NODE}"



@dataclass
class SchedulerStandIn(scheduler_pb2_grpc.SchedulerServicer):
    """Records ReportDevices calls, like the scheduler's embedded backend would take them."""

    reports: list[NodeDevices] = field(default_factory=list)
    usage_seen: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ReportDevices(
        self, request: scheduler_pb2.ReportDevicesRequest, context: grpc.ServicerContext
    ) -> scheduler_pb2.ReportDevicesResponse:
        with self.lock:
            self.reports.append(from_proto(request.report))
            self.usage_seen.append(len(request.report.usage))
        return scheduler_pb2.ReportDevicesResponse()


@dataclass
class Running:
    agent: Agent
    nvml: FakeNVML
    cluster: KubeAPIServer
    scheduler: SchedulerStandIn
    hook_socket: str


@pytest.fixture
def running(kube_api: KubeAPIServer) -> Iterator[Running]:
    kube_api.install_crd(DEVICE_CRD)
    kube_api.put_object("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    tmp = tempfile.mkdtemp(prefix="fgpu-agent-")
    key_path = write_verifying_keys(os.path.join(tmp, "verifying-keys"), signing_key("agent-daemon-test-key"))
    sched_socket = os.path.join(tmp, "sched.sock")
    stand_in = SchedulerStandIn()
    sched_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(stand_in, sched_server)  # type: ignore[no-untyped-call]
    sched_server.add_insecure_port(f"unix://{sched_socket}")
    sched_server.start()
    inventory = load_inventory(T4)
    nvml = FakeNVML(inventory)
    config = AgentConfig(
        node_name=NODE,
        hook_listen=f"unix://{tmp}/hooks.sock",
        verifying_keys=key_path,
        scheduler=f"unix://{sched_socket}",
        metrics_listen="127.0.0.1:0",
        poll_interval_s=0.05,
        discovery_interval_s=1.0,
        report_resync_s=0.5,
        health_quiet_period_s=0.5,
        checkpoint_path=os.path.join(tmp, "no-checkpoint"),
        proc_root=os.path.join(tmp, "proc"),
    )
    agent = Agent(
        config,
        node_name=NODE,
        nvml=nvml,
        topology=InventoryTopology(inventory),
        kube=Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=1.0),
        scheduler=SchedulerReporter(config.scheduler),
    )
    agent.start()
    try:
        yield Running(agent, nvml, kube_api, stand_in, f"{tmp}/hooks.sock")
    finally:
        agent.stop(2)
        sched_server.stop(0).wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _allocatable_core(cluster: KubeAPIServer) -> str:
    node = cluster.get_object(f"/api/v1/nodes/{NODE}") or {}
    return str(((node.get("status") or {}).get("allocatable") or {}).get(names.GPU_CORE, ""))


def _stored(cluster: KubeAPIServer) -> NodeDevices | None:
    obj = cluster.get_object(DEVICE_PATH)
    return from_device_object(obj) if obj else None


def test_the_agent_publishes_its_gpus_to_kubernetes_and_the_scheduler(running: Running) -> None:
    _wait(lambda: (d := _stored(running.cluster)) is not None and len(d.gpus) == 4)
    _wait(lambda: bool(running.scheduler.reports))
    assert [g.uuid for g in running.scheduler.reports[-1].gpus] == [g.uuid for g in running.agent.state.devices().gpus]
    _wait(lambda: _allocatable_core(running.cluster) == "400")


def test_an_xid_reaches_the_device_object_and_recovery_follows(running: Running) -> None:
    _wait(lambda: (d := _stored(running.cluster)) is not None and len(d.gpus) == 4)
    running.nvml.inject_xid(0, 48)
    _wait(lambda: (d := _stored(running.cluster)) is not None and not d.gpus[0].healthy)
    stored = _stored(running.cluster)
    assert stored is not None and stored.gpus[0].health_reason == "Xid48"
    _wait(lambda: _allocatable_core(running.cluster) == "300")
    _wait(lambda: (d := _stored(running.cluster)) is not None and d.gpus[0].healthy)


def test_a_restarted_api_server_that_lost_its_state_gets_the_device_again(running: Running) -> None:
    _wait(lambda: _stored(running.cluster) is not None)
    running.cluster.restart(keep_state=False)
    running.cluster.install_crd(DEVICE_CRD)
    _wait(lambda: _stored(running.cluster) is not None)


def test_the_hook_socket_answers_with_the_live_device_state(running: Running) -> None:
    _wait(lambda: len(running.agent.state.devices().gpus) == 4)
    channel = grpc.insecure_channel(f"unix://{running.hook_socket}")
    stub = hooks_pb2_grpc.RuntimeHooksStub(channel)  # type: ignore[no-untyped-call]
    request = hooks_pb2.ContainerHookRequest(
        pod=hooks_pb2.PodSandboxMeta(uid="u", annotations={names.DEVICE_ALLOCATED: '{"gpu":[{"minor":0}]}'}),
        container=hooks_pb2.ContainerMeta(name="c"),
    )
    response = stub.PreCreateContainer(request, timeout=5)
    channel.close()
    assert "not signed" in response.rejection.reason


def test_the_metrics_endpoint_shows_per_gpu_gauges(running: Running) -> None:
    _wait(lambda: running.agent.worker.cycles > 2)
    with urllib.request.urlopen(f"http://127.0.0.1:{running.agent.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    uuid = running.agent.state.devices().gpus[0].uuid
    assert f'fgpu_agent_gpu_sm_utilization_percent{{uuid="{uuid}"}} 63.0' in text
    assert "fgpu_agent_gpu_healthy{" in text and "fgpu_agent_nvml_up 1.0" in text
