"""The hook creates the MIG instance a signed allocation names, re-uses it for the pod's next
container, refuses with NVML's reason, and destroys it when the pod's sandbox is gone.

The real servicer, ledger and MIG code over the fake NVML (NVIDIA's A100-80GB rules), with the
dynamic-MIG example node: two A100s in MIG mode, no instances but one operator's 1g.10gb on GPU 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import grpc
import pynvml
import pytest

from agent.admissions import AdmissionLedger
from agent.config import AgentConfig, mig_record_path, parse_config
from agent.discovery import discover
from agent.errors import ConfigError
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
KEY = signing_key("agent-mig-hook")
INVENTORY = f"{INVENTORIES}/a100-2x-mig-dynamic.yaml"
GiB = 2**30
#: Never handed to the servicer for real: it is only used when a decision raises.
NO_CONTEXT = cast(grpc.ServicerContext, None)


class Node:
    """One agent's hook over a fake A100 node, as `agent.daemon.Agent` wires it."""

    def __init__(self, tmp: Path, *, nvml: FakeNVML | None = None, complete: bool = True) -> None:
        if nvml is None:
            nvml = FakeNVML(load_inventory(INVENTORY))
            nvml.nvmlInit()
        self.nvml = nvml
        self.devices: NodeDevices = discover(nvml, node_name=NODE, topology=_topology()).devices
        self.gpu0, self.gpu1 = (g.uuid for g in self.devices.gpus)
        self.metrics = AgentMetrics()
        self.ledger = AdmissionLedger()
        self.record_path = tmp / "mig-instances.json"
        self.reports = 0
        record = OwnedFile(self.record_path)
        self.mig = MIGLifecycle(
            MIGNode(nvml, record, observer=MIGReporter(self.metrics, changed=self._changed)),
            record, ledger=self.ledger, devices=lambda: self.devices, ledger_complete=lambda: complete,
        )
        self.hook = GPUHookServicer(
            devices=lambda: self.devices,
            settings=lambda: HookSettings(node_name=NODE, key=verifying(KEY), isolation=names.ISOLATION_NONE),
            metrics=self.metrics, ledger=self.ledger, mig=self.mig,
        )

    def _changed(self) -> None:
        self.reports += 1

    def create(self, uid: str, container: str, annotations: dict[str, str]) -> hooks_pb2.HookResponse:
        request = hooks_pb2.ContainerHookRequest(
            pod=hooks_pb2.PodSandboxMeta(name=f"pod-{uid}", namespace="ml", uid=uid, annotations=annotations),
            container=hooks_pb2.ContainerMeta(name=container),
        )
        return self.hook.PreCreateContainer(request, NO_CONTEXT)

    def stop(self, uid: str) -> None:
        request = hooks_pb2.PodSandboxHookRequest(pod=hooks_pb2.PodSandboxMeta(name=f"pod-{uid}", namespace="ml", uid=uid))
        self.hook.PostStopPodSandbox(request, NO_CONTEXT)

    def instances(self, gpu: str) -> list[tuple[str, int, str]]:
        return sorted((i.profile, i.placement_start, i.uuid) for i in read_instances(self.nvml, gpu))

    def counter(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels or None) or 0.0


def _topology() -> InventoryTopology:
    return InventoryTopology(load_inventory(INVENTORY))


def signed(uid: str, gpu: str, profile: str, start: int, *, containers: tuple[str, ...] = ("main",), minor: int = 0) -> dict[str, str]:
    """The allocation fgpu-scheduler writes for a new instance: profile and placement, signed for the pod."""
    memory = 20 * GiB
    share = GPUShare(
        minor=minor, uuid=gpu, core_percent=30, memory_bytes=memory, memory_ratio_percent=25,
        mig_profile=profile, mig_placement=start,
        containers=tuple(ContainerShare(c, 30, memory, 25) for c in containers),
    )
    return allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=(share,)))


def env(response: hooks_pb2.HookResponse) -> dict[str, str]:
    assert not response.HasField("rejection"), response.rejection.reason
    return {kv.key: kv.value for kv in response.set_envs}


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_the_first_container_gets_an_instance_created_and_the_second_the_same_one(node: Node) -> None:
    annotations = signed("p1", node.gpu0, "3g.40gb", 4, containers=("trainer", "helper"))

    first = env(node.create("p1", "trainer", annotations))

    [(profile, start, uuid)] = node.instances(node.gpu0)
    assert (profile, start) == ("3g.40gb", 4)
    assert uuid.startswith("MIG-")
    assert first[names.NVIDIA_VISIBLE_DEVICES] == uuid
    assert first[names.FGPU_ISOLATION] == names.ISOLATION_NONE  # the hardware enforces the split
    second = env(node.create("p1", "helper", annotations))
    assert second[names.NVIDIA_VISIBLE_DEVICES] == uuid
    assert node.instances(node.gpu0) == [(profile, start, uuid)]
    assert node.counter("fgpu_agent_mig_instances_created_total") == 1
    assert node.reports >= 1  # the scheduler hears of the new instance at once
    (hold,) = node.ledger.pods()["p1"]
    assert (hold.mig_uuid, hold.mig_profile, hold.mig_placement) == (uuid, "3g.40gb", 4)
    recorded = json.loads(node.record_path.read_text())
    assert [(r["gpu_uuid"], r["profile"], r["placement_start"]) for r in recorded] == [(node.gpu0, "3g.40gb", 4)]


def test_a_sidecar_of_the_pod_sees_void_while_the_instance_is_made_for_the_pod(node: Node) -> None:
    annotations = signed("p1", node.gpu0, "1g.10gb", 6, containers=("main",))

    sidecar = env(node.create("p1", "log-shipper", annotations))

    assert sidecar[names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID
    [(_, _, uuid)] = node.instances(node.gpu0)
    assert env(node.create("p1", "main", annotations))[names.NVIDIA_VISIBLE_DEVICES] == uuid


def test_a_placement_taken_behind_the_schedulers_back_is_refused_with_nvmls_reason(node: Node) -> None:
    # Someone (an operator's nvidia-smi) made a 1g at slice 1 after the last report: a 2g at 0 overlaps it.
    handle = node.nvml.nvmlDeviceGetHandleByUUID(node.gpu0)
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 1, 1
    node.nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, placement)  # 19: 1g.10gb
    reports = node.reports

    refused = node.create("p1", "main", signed("p1", node.gpu0, "2g.20gb", 0))

    reason = refused.rejection.reason
    assert "pod ml/pod-p1 (p1)" in reason and node.gpu0 in reason
    assert "2g.20gb at memory slice 0" in reason and "insufficient resources" in reason
    assert "the scheduler will see it in the next report" in reason
    assert node.counter("fgpu_agent_mig_instance_failures_total", action="create") == 1
    assert node.reports > reports
    assert "p1" not in node.ledger.pods()
    assert [(p, s) for p, s, _ in node.instances(node.gpu0)] == [("1g.10gb", 1)]  # nothing half-made is left


class BusyDriver(FakeNVML):
    """A driver another client holds (an nvidia-smi, a profiler): it refuses to create anything."""

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profileId: int, placement: Any) -> Any:
        raise pynvml.NVMLError_InUse()


def test_a_create_nvml_refuses_as_in_use_rejects_the_container_with_that_reason(tmp_path: Path) -> None:
    nvml = BusyDriver(load_inventory(INVENTORY))
    nvml.nvmlInit()
    node = Node(tmp_path, nvml=nvml)

    refused = node.create("p1", "main", signed("p1", node.gpu0, "3g.40gb", 4))

    assert "creating 3g.40gb at memory slice 4" in refused.rejection.reason
    assert "in use" in refused.rejection.reason
    assert node.instances(node.gpu0) == []


def test_of_two_pods_given_one_placement_the_second_is_refused_naming_the_first(node: Node) -> None:
    uuid = env(node.create("first", "main", signed("first", node.gpu0, "3g.40gb", 4)))[names.NVIDIA_VISIBLE_DEVICES]

    late = node.create("second", "main", signed("second", node.gpu0, "3g.40gb", 4))

    assert "held by pod first" in late.rejection.reason
    assert node.instances(node.gpu0) == [("3g.40gb", 4, uuid)]


def test_an_operators_instance_is_never_taken_for_a_create(node: Node) -> None:
    [(profile, start, operators)] = node.instances(node.gpu1)

    refused = node.create("p1", "main", signed("p1", node.gpu1, profile, start, minor=1))

    assert "an operator's 1g.10gb instance" in refused.rejection.reason
    assert node.instances(node.gpu1) == [(profile, start, operators)]


def test_an_allocation_that_does_not_verify_creates_nothing(node: Node) -> None:
    annotations = signed("p1", node.gpu0, "7g.80gb", 0)

    refused = node.create("someone-else", "main", annotations)  # signed for p1, presented by another pod

    assert refused.rejection.reason
    assert node.instances(node.gpu0) == []


def test_a_placement_the_profile_never_takes_is_refused_before_nvml(node: Node) -> None:
    refused = node.create("p1", "main", signed("p1", node.gpu0, "3g.40gb", 2))

    assert "3g.40gb can start only at memory slices 0, 4" in refused.rejection.reason
    assert node.instances(node.gpu0) == []


def test_the_instance_goes_when_the_pods_sandbox_stops_and_the_operators_stays(node: Node) -> None:
    env(node.create("p1", "main", signed("p1", node.gpu0, "3g.40gb", 4)))
    operators = node.instances(node.gpu1)

    node.stop("p1")

    assert node.instances(node.gpu0) == []
    assert node.instances(node.gpu1) == operators
    assert json.loads(node.record_path.read_text()) == []
    assert node.counter("fgpu_agent_mig_instances_destroyed_total") == 1
    assert "p1" not in node.ledger.pods()


def test_an_instance_a_process_still_runs_on_stays_until_it_is_idle(node: Node) -> None:
    uuid = env(node.create("p1", "main", signed("p1", node.gpu0, "2g.20gb", 2)))[names.NVIDIA_VISIBLE_DEVICES]
    gi = next(i.gi_id for i in read_instances(node.nvml, node.gpu0) if i.uuid == uuid)
    node.nvml.set_usage(0, processes=(ProcessSpec(pid=42, used_memory_bytes=GiB, gpu_instance_id=gi, compute_instance_id=0),))

    node.stop("p1")

    assert [u for _, _, u in node.instances(node.gpu0)] == [uuid]
    node.nvml.set_usage(0, processes=())
    assert [i.uuid for i in node.mig.reconcile()] == [uuid]
    assert node.instances(node.gpu0) == []


def test_without_a_complete_ledger_a_stopped_pod_takes_only_its_own_instances(tmp_path: Path) -> None:
    # No pod listing since the start: an idle instance fgpu made may belong to a pod not counted yet.
    node = Node(tmp_path, complete=False)
    env(node.create("mine", "main", signed("mine", node.gpu0, "1g.10gb", 0)))
    uncounted = env(node.create("uncounted", "main", signed("uncounted", node.gpu0, "1g.10gb", 1)))
    node.ledger.release(pod_uid="uncounted")  # as if this process had never admitted it

    assert node.mig.reconcile() == []
    node.stop("mine")

    assert [u for _, _, u in node.instances(node.gpu0)] == [uncounted[names.NVIDIA_VISIBLE_DEVICES]]


def test_reports_mark_fgpus_instances_and_not_the_operators(node: Node) -> None:
    made = env(node.create("p1", "main", signed("p1", node.gpu0, "4g.40gb", 0)))[names.NVIDIA_VISIBLE_DEVICES]
    node.devices = discover(node.nvml, node_name=NODE, topology=_topology()).devices  # the rediscovery asked for

    marked = node.mig.mark(node.devices)

    created = {m.uuid: m.fgpu_created for g in marked.gpus for m in g.mig_instances}
    [(_, _, operators)] = node.instances(node.gpu1)
    assert created == {made: True, operators: False}


def test_the_mig_record_lives_beside_the_hook_socket_unless_state_dir_says_otherwise() -> None:
    assert mig_record_path(AgentConfig()) == "/var/run/fgpu-agent/mig-instances.json"
    assert mig_record_path(AgentConfig(hook_listen="unix:///tmp/n1/hooks.sock")) == "/tmp/n1/mig-instances.json"
    assert mig_record_path(AgentConfig(hook_listen="127.0.0.1:7000")) == "/var/run/fgpu-agent/mig-instances.json"
    assert mig_record_path(parse_config({"stateDir": "/srv/fgpu"})) == "/srv/fgpu/mig-instances.json"
    with pytest.raises(ConfigError, match="stateDir='state' must be an absolute path"):
        parse_config({"stateDir": "state"})
