"""Review of dynamic MIG on the node (issue 20): defects found, each shown through the production path.

The real hook servicer, admission ledger, `MIGLifecycle` and `MIGNode` over the fake NVML with NVIDIA's
A100-80GB rules, wired as `agent.daemon.Agent` wires them, on the dynamic-MIG example node (two A100s in
MIG mode, GPU 1 holding one operator-made 1g.10gb). Each test failed on the defect its section names and
guards the fix (docs/mig.md: ownership by MIG device UUID, every live hold counting, the ledger's lock
released across NVML's create and destroy).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

import grpc
import pynvml

from agent import nvmlapi
from agent.admissions import AdmissionLedger
from agent.discovery import discover
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import ProcessSpec, load_inventory
from agent.hook import HookSettings
from agent.hookserver import GPUHookServicer
from agent.metrics import AgentMetrics
from agent.mig_lifecycle import MIGLifecycle, MIGReporter
from agent.mig_nvml import MIGNode, OwnedFile, read_instances
from agent.pcitopology import InventoryTopology
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare
from apis.devices import NodeDevices
from apis.fgpu.v1 import hooks_pb2
from apis.signing import allocation_annotations
from tests.agent.helpers import INVENTORIES
from tests.signing_keys import signing_key, verifying

NODE = "mig-node"
KEY = signing_key("mig-review")
INVENTORY = f"{INVENTORIES}/a100-2x-mig-dynamic.yaml"
GiB = 2**30
NO_CONTEXT = cast(grpc.ServicerContext, None)
SLOW_CREATE_S = 1.5


class Node:
    """One agent's hook, ledger and MIG lifecycle over a fake A100 node (a restart: a new Node, same NVML and dir)."""

    def __init__(self, tmp: Path, *, nvml: FakeNVML | None = None) -> None:
        if nvml is None:
            nvml = FakeNVML(load_inventory(INVENTORY))
            nvml.nvmlInit()
        self.nvml = nvml
        self.devices: NodeDevices = self.discover()
        self.gpu0, self.gpu1 = (g.uuid for g in self.devices.gpus)
        self.ledger = AdmissionLedger()
        metrics = AgentMetrics()
        record = OwnedFile(tmp / "mig-instances.json")
        self.mig = MIGLifecycle(
            MIGNode(nvml, record, observer=MIGReporter(metrics, changed=lambda: None)),
            record, ledger=self.ledger, devices=lambda: self.devices, ledger_complete=lambda: True,
        )
        self.hook = GPUHookServicer(
            devices=lambda: self.devices,
            settings=lambda: HookSettings(node_name=NODE, key=verifying(KEY), isolation=names.ISOLATION_NONE),
            metrics=metrics, ledger=self.ledger, mig=self.mig,
        )

    def discover(self) -> NodeDevices:
        return discover(self.nvml, node_name=NODE, topology=InventoryTopology(load_inventory(INVENTORY))).devices

    def create(self, uid: str, annotations: dict[str, str]) -> hooks_pb2.HookResponse:
        request = hooks_pb2.ContainerHookRequest(
            pod=hooks_pb2.PodSandboxMeta(name=f"pod-{uid}", namespace="ml", uid=uid, annotations=annotations),
            container=hooks_pb2.ContainerMeta(name="main"),
        )
        return self.hook.PreCreateContainer(request, NO_CONTEXT)

    def stop(self, uid: str) -> None:
        request = hooks_pb2.PodSandboxHookRequest(pod=hooks_pb2.PodSandboxMeta(name=f"pod-{uid}", namespace="ml", uid=uid))
        self.hook.PostStopPodSandbox(request, NO_CONTEXT)

    def uuids(self, gpu: str) -> list[str]:
        return sorted(i.uuid for i in read_instances(self.nvml, gpu))


def _share(gpu: str, minor: int, **mig: Any) -> GPUShare:
    memory = 20 * GiB
    return GPUShare(
        minor=minor, uuid=gpu, core_percent=30, memory_bytes=memory, memory_ratio_percent=25,
        containers=(ContainerShare("main", 30, memory, 25),), **mig,
    )


def by_placement(uid: str, gpu: str, profile: str, start: int, *, minor: int = 0) -> dict[str, str]:
    """fgpu-scheduler's allocation for an instance the node creates (or re-uses) at a placement."""
    share = _share(gpu, minor, mig_profile=profile, mig_placement=start)
    return allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=(share,)))


def by_uuid(uid: str, gpu: str, mig_uuid: str, *, minor: int = 0) -> dict[str, str]:
    """fgpu-scheduler's allocation for an existing instance it took for an operator's, named by UUID."""
    share = _share(gpu, minor, mig_uuid=mig_uuid)
    return allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=(share,)))


def visible(response: hooks_pb2.HookResponse) -> str:
    assert not response.HasField("rejection"), response.rejection.reason
    return {kv.key: kv.value for kv in response.set_envs}[names.NVIDIA_VISIBLE_DEVICES]


# --- 1. a stale record entry adopts an operator's instance ------------------------------------------------


def _operator_recreates(nvml: FakeNVML, gpu: str, gi_id: int, profile_id: int, start: int, slices: int) -> str:
    """What `nvidia-smi mig -dci/-dgi` then `-cgi/-cci` (or mig-parted apply) does while the agent is down."""
    handle = nvml.nvmlDeviceGetHandleByUUID(gpu)
    gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
    nvml.nvmlGpuInstanceDestroy(gi)
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = start, 4
    made = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, placement)
    nvml.nvmlGpuInstanceCreateComputeInstance(made, nvmlapi.NVML_COMPUTE_INSTANCE_PROFILE_BY_SLICES[slices])
    return str(next(i.uuid for i in read_instances(nvml, gpu) if i.placement_start == start))


def test_an_operators_instance_made_where_fgpus_was_is_never_destroyed_after_a_restart(tmp_path: Path) -> None:
    node = Node(tmp_path)
    ours = visible(node.create("w", by_placement("w", node.gpu0, "3g.40gb", 4)))
    gi_id = next(i.gi_id for i in read_instances(node.nvml, node.gpu0) if i.uuid == ours)
    # The agent is stopped (upgrade, crash); pod w goes; the operator repartitions GPU 0 by hand.
    operators = _operator_recreates(node.nvml, node.gpu0, gi_id, 9, 4, 3)  # 9: 3g.40gb
    assert operators != ours
    assert next(i.gi_id for i in read_instances(node.nvml, node.gpu0) if i.uuid == operators) == gi_id

    restarted = Node(tmp_path, nvml=node.nvml)
    marked = restarted.mig.mark(restarted.devices)
    restarted.mig.reconcile()

    assert restarted.uuids(node.gpu0) == [operators], "the operator's instance was destroyed"
    assert not any(m.fgpu_created for g in marked.gpus for m in g.mig_instances), "reported as fgpu's"


# --- 2. an fgpu instance held by UUID is not protected ----------------------------------------------------


def _held_by_uuid(node: Node) -> str:
    """Pod x holds fgpu's instance U by UUID: U was left busy by pod w, and a scheduler whose report showed it
    as not fgpu's (record unreadable for one report, or an unsettled create intent) named it by UUID."""
    ours = visible(node.create("w", by_placement("w", node.gpu0, "3g.40gb", 4)))
    gi_id = next(i.gi_id for i in read_instances(node.nvml, node.gpu0) if i.uuid == ours)
    node.nvml.set_usage(0, processes=(ProcessSpec(pid=42, used_memory_bytes=GiB, gpu_instance_id=gi_id, compute_instance_id=0),))
    node.stop("w")
    assert node.uuids(node.gpu0) == [ours]  # kept while busy, as documented
    node.devices = node.discover()
    assert visible(node.create("x", by_uuid("x", node.gpu0, ours))) == ours
    node.nvml.set_usage(0, processes=())
    return ours


def test_another_pods_sandbox_stop_never_destroys_an_instance_a_running_pod_holds_by_uuid(tmp_path: Path) -> None:
    node = Node(tmp_path)
    held = _held_by_uuid(node)
    visible(node.create("z", by_placement("z", node.gpu0, "1g.10gb", 0)))

    node.stop("z")

    assert held in node.uuids(node.gpu0), "pod x's instance was destroyed while pod x runs"


def test_an_instance_a_pod_holds_by_uuid_is_not_handed_to_a_second_pod_by_placement(tmp_path: Path) -> None:
    node = Node(tmp_path)
    _held_by_uuid(node)

    second = node.create("y", by_placement("y", node.gpu0, "3g.40gb", 4))

    assert second.HasField("rejection"), "pod y was given the MIG instance pod x holds"


# --- 3. the ledger lock is held across NVML's create -------------------------------------------------------


class SlowCreate(FakeNVML):
    """A driver whose GPU-instance create takes as long as real ones can (seconds under load)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.creating = threading.Event()

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profileId: int, placement: Any) -> Any:
        self.creating.set()
        time.sleep(SLOW_CREATE_S)
        return super().nvmlDeviceCreateGpuInstanceWithPlacement(handle, profileId, placement)


def test_a_slow_mig_create_does_not_hold_up_another_pods_admission_on_another_gpu(tmp_path: Path) -> None:
    nvml = SlowCreate(load_inventory(INVENTORY))
    nvml.nvmlInit()
    node = Node(tmp_path, nvml=nvml)
    (operators,) = node.uuids(node.gpu1)
    creating = threading.Thread(target=node.create, args=("slow", by_placement("slow", node.gpu0, "3g.40gb", 4)))
    creating.start()
    try:
        assert nvml.creating.wait(5.0)
        started = time.monotonic()
        assert visible(node.create("other", by_uuid("other", node.gpu1, operators, minor=1))) == operators
        waited = time.monotonic() - started
    finally:
        creating.join()

    assert waited < SLOW_CREATE_S / 3, f"an unrelated admission waited {waited:.2f}s for another pod's MIG create"
