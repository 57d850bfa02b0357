"""Across an agent restart, fgpu's MIG instances are reconciled with the pods still running.

The whole agent (`agent.daemon.Agent`) against the Kubernetes API double, twice, over one fake
NVML: the GPU keeps its instances while the agent process is gone, as a real one does. What
survives the process is only the record file and NVML; the pods come from the API.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent.config import AgentConfig, mig_record_path
from agent.daemon import Agent
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import ProcessSpec, load_inventory
from agent.kube import Kube
from agent.mig_nvml import read_instances
from agent.pcitopology import InventoryTopology
from apis import names
from apis.devices import from_device_object
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from tests.kubeapi import DEVICE_CRD, KubeAPIServer
from tests.mig.test_agent_mig_hook import INVENTORY, KEY, NODE, signed
from tests.signing_keys import write_verifying_keys
from tests.waiting import wait_until as _wait

DEVICE_PATH = f"/apis/{names.DEVICE_GROUP}/{names.DEVICE_VERSION}/devices/{NODE}"
GPU0 = "GPU-5e1d0a7c-3b1f-4c6e-9a2d-7f0e1b2c3d40"
OPERATORS = "MIG-0c7e4d1a-2b3c-4d5e-8f60-718293a4b5c6"



@pytest.fixture
def workdir() -> Iterator[str]:
    tmp = tempfile.mkdtemp(prefix="fgpu-mig-")  # short: a unix socket path must fit in 108 bytes
    write_verifying_keys(os.path.join(tmp, "verifying-keys"), KEY)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _agent(kube_api: KubeAPIServer, tmp: str, nvml: FakeNVML) -> Agent:
    config = AgentConfig(
        node_name=NODE,
        hook_listen=f"unix://{tmp}/hooks.sock",
        verifying_keys=os.path.join(tmp, "verifying-keys"),
        metrics_listen="",
        poll_interval_s=0.05,
        discovery_interval_s=30.0,  # the report after a create or destroy must come from rediscover()
        report_resync_s=30.0,
        admission_sweep_s=60.0,
        admission_sweep_grace_s=600.0,
        checkpoint_path=os.path.join(tmp, "no-checkpoint"),
        proc_root=os.path.join(tmp, "proc"),
    )
    return Agent(
        config, node_name=NODE, nvml=nvml, topology=InventoryTopology(load_inventory(INVENTORY)),
        kube=Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=1.0),
    )


def _pod(uid: str, annotations: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": uid, "namespace": "ml", "uid": uid, "annotations": annotations},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running"},
    }


def _admit(tmp: str, uid: str, annotations: dict[str, str]) -> str:
    with grpc.insecure_channel(f"unix://{tmp}/hooks.sock") as channel:
        stub = hooks_pb2_grpc.RuntimeHooksStub(channel)  # type: ignore[no-untyped-call]
        response = stub.PreCreateContainer(hooks_pb2.ContainerHookRequest(
            pod=hooks_pb2.PodSandboxMeta(name=uid, namespace="ml", uid=uid, annotations=annotations),
            container=hooks_pb2.ContainerMeta(name="main"),
        ), timeout=5)
    assert not response.HasField("rejection"), response.rejection.reason
    return str(next(kv.value for kv in response.set_envs if kv.key == names.NVIDIA_VISIBLE_DEVICES))


def _reported(kube_api: KubeAPIServer) -> dict[str, bool]:
    """MIG UUID -> fgpu_created, as the node's Device object says."""
    obj = kube_api.get_object(DEVICE_PATH)
    if not obj:
        return {}
    return {m.uuid: m.fgpu_created for g in from_device_object(obj).gpus for m in g.mig_instances}


def _on_gpu(nvml: FakeNVML) -> set[str]:
    return {i.uuid for uuid in (GPU0, "GPU-5e1d0a7c-3b1f-4c6e-9a2d-7f0e1b2c3d41") for i in read_instances(nvml, uuid)}


def test_a_restarted_agent_destroys_only_fgpus_idle_instances_no_running_pod_holds(
    kube_api: KubeAPIServer, workdir: str
) -> None:
    kube_api.install_crd(DEVICE_CRD)
    kube_api.put_object("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    nvml = FakeNVML(load_inventory(INVENTORY))
    nvml.nvmlInit()  # the test's own reference: the agents' shutdowns leave the "driver" loaded
    wants = {"keeps": ("3g.40gb", 4), "goes": ("1g.10gb", 0), "busy": ("2g.20gb", 2)}
    annotations = {uid: signed(uid, GPU0, profile, start) for uid, (profile, start) in wants.items()}
    for uid, a in annotations.items():
        kube_api.put_object("/api/v1/namespaces/ml/pods", _pod(uid, a))

    first = _agent(kube_api, workdir, nvml)
    first.start()
    try:
        made = {uid: _admit(workdir, uid, a) for uid, a in annotations.items()}
        # The report after the creates comes at once (rediscovery), not at the 30 s discovery interval.
        _wait(lambda: _reported(kube_api) == {**{u: True for u in made.values()}, OPERATORS: False})
    finally:
        first.stop(2)
    busy_gi = next(i.gi_id for i in read_instances(nvml, GPU0) if i.uuid == made["busy"])
    nvml.set_usage(0, processes=(ProcessSpec(pid=7, used_memory_bytes=2**30, gpu_instance_id=busy_gi, compute_instance_id=0),))
    # While no agent runs, two pods are deleted: their PostStopPodSandbox reaches no one.
    for uid in ("goes", "busy"):
        kube_api.kubelet_confirm_deletion("ml", uid)

    second = _agent(kube_api, workdir, nvml)
    second.start()
    try:
        assert set(second.ledger.pods()) == {"keeps"}
        # Reconciled before the hook served: the gone pod's idle instance is destroyed; the running
        # pod's, the one a process still runs on and the operator's stay.
        assert _on_gpu(nvml) == {made["keeps"], made["busy"], OPERATORS}
        _wait(lambda: _reported(kube_api) == {made["keeps"]: True, made["busy"]: True, OPERATORS: False})
        assert second.metrics.registry.get_sample_value("fgpu_agent_mig_instances_destroyed_total") == 1

        # The record is lost (deleted by hand): an idle instance no pod holds is no longer provably
        # fgpu's, so it is leaked, never destroyed on a guess, and reported as not fgpu's.
        # (The record goes first: with it, the agent's own sweep may rightly destroy the busy
        # instance the moment its process ends.)
        Path(mig_record_path(second.config)).unlink()
        nvml.set_usage(0, processes=())
        second.mig.reconcile()
        assert _on_gpu(nvml) == {made["keeps"], made["busy"], OPERATORS}
        for loop in second.loops:  # NVML shows no change, so only a resync would carry it: ask for one
            loop.poke()
        _wait(lambda: _reported(kube_api).get(made["busy"]) is False)
    finally:
        second.stop(2)
