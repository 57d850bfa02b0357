"""The RuntimeHooks server on a real unix socket, as the runtime proxy calls it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agent.discovery import discover
from agent.hook import HookSettings
from agent.hookserver import SERVICE_NAME, GPUHookServicer, HookServer
from agent.isolation.registry import IsolationPaths
from agent.metrics import AgentMetrics
from agent.pcitopology import InventoryTopology
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare
from apis.devices import NodeDevices
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from apis.signing import SigningKeyError, VerifyingKeys, allocation_annotations
from tests.agent.helpers import T4, started_fake
from tests.signing_keys import signing_key, verifying

KEY = signing_key("hook-server-test-key")
NODE = "gpu-node-1"
UID = "0f1e2d3c-4b5a-4697-8887-a6b5c4d3e2f1"


@dataclass
class Running:
    stub: hooks_pb2_grpc.RuntimeHooksStub
    channel: grpc.Channel
    devices: NodeDevices
    metrics: AgentMetrics
    cache_root: str
    key: list[VerifyingKeys]


@pytest.fixture
def running() -> Iterator[Running]:
    tmp = tempfile.mkdtemp(prefix="fgpu-hook-")
    nvml, inventory = started_fake(T4)
    devices = discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices
    metrics = AgentMetrics()
    cache_root = os.path.join(tmp, "cache")
    key = [verifying(KEY)]

    def settings() -> HookSettings:
        if not key:
            raise SigningKeyError("allocation signing key file /etc/fgpu/signing.key does not exist")
        return HookSettings(
            node_name=NODE, key=key[0], isolation=names.ISOLATION_HAMI_CORE,
            paths=IsolationPaths(hami_cache_root=cache_root, hami_lock_dir=os.path.join(tmp, "lock")),
        )

    socket = os.path.join(tmp, "hooks.sock")
    server = HookServer(
        listen=f"unix://{socket}",
        servicer=GPUHookServicer(devices=lambda: devices, settings=settings, metrics=metrics),
    )
    server.start()
    channel = grpc.insecure_channel(f"unix://{socket}")
    try:
        yield Running(hooks_pb2_grpc.RuntimeHooksStub(channel), channel, devices, metrics, cache_root, key)  # type: ignore[no-untyped-call]
    finally:
        channel.close()
        server.stop(0)
        shutil.rmtree(tmp, ignore_errors=True)


def _request(
    annotations: dict[str, str], *, uid: str = UID, container: str = "main"
) -> hooks_pb2.ContainerHookRequest:
    return hooks_pb2.ContainerHookRequest(
        pod=hooks_pb2.PodSandboxMeta(name="trainer-0", namespace="ml", uid=uid, annotations=annotations),
        container=hooks_pb2.ContainerMeta(name=container),
    )


def _signed(devices: NodeDevices, *, uid: str = UID, core: int = 50) -> dict[str, str]:
    gpu = devices.gpus[0]
    share = GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=core, memory_bytes=2**32, memory_ratio_percent=25,
        containers=(ContainerShare("main", core, 2**32, 25),),
    )
    return allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=(share,)))


def _stop_sandbox(running: Running, uid: str) -> None:
    running.stub.PostStopPodSandbox(hooks_pb2.PodSandboxHookRequest(pod=hooks_pb2.PodSandboxMeta(uid=uid)), timeout=5)


def test_a_signed_allocation_gets_env_and_mounts_and_its_cache_directory(running: Running) -> None:
    response = running.stub.PreCreateContainer(_request(_signed(running.devices)), timeout=5)
    assert not response.HasField("rejection")
    env = {kv.key: kv.value for kv in response.set_envs}
    assert env[names.NVIDIA_VISIBLE_DEVICES] == running.devices.gpus[0].uuid
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert "/etc/ld.so.preload" in {m.container_path for m in response.add_mounts}
    assert os.path.isdir(os.path.join(running.cache_root, f"{UID}_main"))
    assert running.metrics.hook_decisions.labels("admitted")._value.get() == 1


def test_an_unsigned_allocation_is_a_rejection_with_the_reason(running: Running) -> None:
    annotations = _signed(running.devices)
    del annotations[names.ALLOCATION_SIGNATURE]
    response = running.stub.PreCreateContainer(_request(annotations), timeout=5)
    assert response.HasField("rejection") and "not signed" in response.rejection.reason
    assert not response.set_envs


def test_a_pod_without_allocation_gets_an_empty_answer(running: Running) -> None:
    assert running.stub.PreCreateContainer(_request({}), timeout=5) == hooks_pb2.HookResponse()


def test_without_a_signing_key_allocations_are_refused_and_other_pods_untouched(running: Running) -> None:
    running.key.clear()
    refused = running.stub.PreCreateContainer(_request(_signed(running.devices)), timeout=5)
    assert "cannot verify" in refused.rejection.reason and "signing.key" in refused.rejection.reason
    assert running.stub.PreCreateContainer(_request({}), timeout=5) == hooks_pb2.HookResponse()


def test_stopping_the_pod_sandbox_removes_its_cache_directories(running: Running) -> None:
    running.stub.PreCreateContainer(_request(_signed(running.devices)), timeout=5)
    _stop_sandbox(running, UID)
    assert os.listdir(running.cache_root) == []


def test_the_socket_serves_health_and_reflection(running: Running) -> None:
    health = health_pb2_grpc.HealthStub(running.channel)
    status = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(running.channel)
    answers = reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    listed = {s.name for a in answers for s in a.list_services_response.service}
    assert SERVICE_NAME in listed and "grpc.health.v1.Health" in listed


OTHER_UID = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"


def test_a_pod_that_would_overcommit_a_gpu_next_to_an_admitted_pod_is_refused_until_that_pod_stops(
    running: Running,
) -> None:
    first = running.stub.PreCreateContainer(_request(_signed(running.devices, core=60)), timeout=5)
    assert not first.HasField("rejection")
    other = _request(_signed(running.devices, uid=OTHER_UID, core=50), uid=OTHER_UID)
    refused = running.stub.PreCreateContainer(other, timeout=5)
    reason = refused.rejection.reason
    assert f"GPU {running.devices.gpus[0].uuid}" in reason
    assert f"60% and {2**32} bytes held by 1 pod(s) already admitted on this node ({UID})" in reason
    assert not refused.set_envs
    _stop_sandbox(running, UID)
    assert not running.stub.PreCreateContainer(other, timeout=5).HasField("rejection")
    assert running.metrics.admitted_pods._value.get() == 1


def test_restarts_and_more_containers_of_one_pod_do_not_count_twice(running: Running) -> None:
    annotations = _signed(running.devices, core=60)
    for container in ("main", "main", "sidecar"):  # a restart of main, then a second container
        response = running.stub.PreCreateContainer(_request(annotations, container=container), timeout=5)
        assert not response.HasField("rejection"), response.rejection.reason
    fits = _request(_signed(running.devices, uid=OTHER_UID, core=40), uid=OTHER_UID)
    assert not running.stub.PreCreateContainer(fits, timeout=5).HasField("rejection")
    assert running.metrics.admitted_pods._value.get() == 2


def test_a_bare_servicer_starts_with_an_empty_ledger_and_readmits_running_pods() -> None:
    nvml, inventory = started_fake(T4)
    devices = discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices
    restarted = GPUHookServicer(
        devices=lambda: devices, settings=lambda: HookSettings(node_name=NODE, key=verifying(KEY), isolation=names.ISOLATION_NONE)
    )
    assert restarted.ledger.pods() == {}
    response = restarted.PreCreateContainer(_request(_signed(devices, core=60)), context=None)  # type: ignore[arg-type]
    assert not response.HasField("rejection")
    assert list(restarted.ledger.pods()) == [UID]
