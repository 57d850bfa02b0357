"""The agent carries out `fgpuctl mig` requests on its Node: only drained, never busy, and says so.

`MIGModeSwitch` with the real ledger, MIG lifecycle and agent Kubernetes client over the fake
NVML (mode changes as nvml.h describes them) and the Kubernetes API double; then the whole
round trip, `fgpuctl mig enable` against a running agent.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.admissions import AdmissionLedger, Hold
from agent.config import AgentConfig
from agent.daemon import Agent
from agent.discovery import discover
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import Inventory, ProcessSpec, parse_inventory
from agent.kube import Kube
from agent.mig_lifecycle import MIGLifecycle
from agent.mig_manager import Want
from agent.mig_mode_switch import MIGModeSwitch
from agent.mig_nvml import MIGNode, OwnedFile, read_instances
from agent.pcitopology import InventoryTopology
from apis import names
from apis.devices import NodeDevices, from_device_object
from apis.mig import mode_request_key, mode_requests
from apis.mig_mode import ModeState, statuses
from fgpuctl.main import main as fgpuctl
from tests.kubeapi import DEVICE_CRD, KubeAPIServer
from tests.signing_keys import signing_key, write_verifying_keys
from tests.waiting import wait_until as _wait

NODE = "mig-mode-node"
OFF_GPU = "GPU-7a1e0c2d-0000-4000-8000-000000000000"
ON_GPU = "GPU-7a1e0c2d-0000-4000-8000-000000000001"


def inventory(*, operator_instance: bool = False) -> Inventory:
    return parse_inventory({"gpus": [
        {"uuid": OFF_GPU, "name": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "busId": "00000000:07:00.0",
         "mig": {"mode": "disabled"}},
        {"uuid": ON_GPU, "name": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "busId": "00000000:0F:00.0",
         "mig": {"mode": "enabled", "instances": [
             {"uuid": "MIG-op", "profile": "1g.10gb", "gpuInstanceId": 7}] if operator_instance else []}},
    ]})


class Rig:
    """The switch as `agent.daemon.Agent` wires it, with a Node in the API double."""

    def __init__(self, api: KubeAPIServer, tmp: Path, *, operator_instance: bool = False, cordoned: bool = True) -> None:
        self.api = api
        self.inventory = inventory(operator_instance=operator_instance)
        self.nvml = FakeNVML(self.inventory)
        self.nvml.nvmlInit()
        self.ledger = AdmissionLedger()
        self.record = OwnedFile(tmp / "mig-instances.json")
        self.node = MIGNode(self.nvml, self.record)
        self.mig = MIGLifecycle(self.node, self.record, ledger=self.ledger, devices=self.devices, ledger_complete=lambda: True)
        self.kube = Kube.connect(kubeconfig=api.kubeconfig_path, request_timeout_s=2.0)
        self.rediscoveries = 0
        self.switch = MIGModeSwitch(
            node_name=NODE, kube=self.kube, nvml=self.nvml, mig=self.mig, ledger=self.ledger, devices=self.devices,
            ledger_complete=lambda: True, changed=self._changed,
        )
        api.put_object("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        self.cordon(cordoned)

    def devices(self) -> NodeDevices:
        return discover(self.nvml, node_name=NODE, topology=InventoryTopology(self.inventory)).devices

    def _changed(self) -> None:
        self.rediscoveries += 1

    def cordon(self, on: bool = True) -> None:
        node: Any = self.api.get_object(f"/api/v1/nodes/{NODE}")
        node["spec"] = {"unschedulable": True} if on else {}
        self.api.put_object("/api/v1/nodes", node)

    def request(self, gpu: str, value: str) -> None:
        self.kube.patch_node_annotations(NODE, {mode_request_key(gpu): value})

    def annotations(self) -> dict[str, str]:
        node: Any = self.api.get_object(f"/api/v1/nodes/{NODE}")
        return dict(node["metadata"].get("annotations") or {})

    def answer(self, gpu: str) -> tuple[ModeState, str] | None:
        status = statuses(self.annotations()).get(gpu)
        return None if status is None else (status.state, status.message)

    def requested(self) -> dict[str, bool]:
        return mode_requests(self.annotations())

    def mode(self, gpu: str) -> list[int]:
        return list(self.nvml.nvmlDeviceGetMigMode(self.nvml.nvmlDeviceGetHandleByUUID(gpu)))

    def events(self) -> list[tuple[str, str]]:
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(config_file=self.api.kubeconfig_path))
        return [(e.type, e.reason) for e in core.list_namespaced_event("default").items]


ON, OFF = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE


@pytest.fixture
def rig(kube_api: KubeAPIServer, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(kube_api, tmp_path)
    yield r
    r.kube.close()


def test_an_idle_gpu_on_a_cordoned_node_is_switched_answered_and_the_request_removed(rig: Rig) -> None:
    rig.request(OFF_GPU, "enabled")

    rig.switch.report()

    assert rig.mode(OFF_GPU) == [ON, ON]
    assert rig.answer(OFF_GPU) == (ModeState.DONE, f"GPU 0 ({OFF_GPU}) switched into MIG mode")
    assert rig.requested() == {}
    assert rig.events() == [("Normal", names.EVENT_MIG_MODE_CHANGED)]
    assert rig.rediscoveries == 1  # a fresh Device report with the new mode
    assert rig.devices().gpus[0].mig_enabled


def test_a_busy_gpu_is_never_switched_the_answer_says_why_and_it_goes_once_drained(rig: Rig) -> None:
    rig.request(OFF_GPU, "enabled")
    rig.cordon(False)
    rig.switch.report()
    assert rig.answer(OFF_GPU) is not None and "not cordoned" in rig.answer(OFF_GPU)[1]  # type: ignore[index]

    rig.cordon(True)
    rig.ledger.record(pod_uid="uid-train", holds=(Hold(OFF_GPU, 30, 2**30),))
    rig.switch.report()
    assert rig.answer(OFF_GPU) == (ModeState.WAITING, f"GPU 0 ({OFF_GPU}) is not switched into MIG mode yet: pods hold it (uid-train); drain them")

    rig.ledger.release(pod_uid="uid-train")
    rig.nvml.set_usage(0, processes=(ProcessSpec(pid=42, used_memory_bytes=2**20),))
    rig.switch.report()
    rig.switch.report()  # the same answer again: no new Event
    assert "1 process(es) run on it" in rig.answer(OFF_GPU)[1]  # type: ignore[index]
    assert rig.mode(OFF_GPU) == [OFF, OFF] and rig.requested() == {OFF_GPU: True}
    assert rig.events() == [("Normal", names.EVENT_MIG_MODE_WAITING)]

    rig.nvml.set_usage(0, processes=())
    rig.switch.report()
    assert rig.mode(OFF_GPU) == [ON, ON] and rig.requested() == {}


def test_leaving_mig_mode_destroys_fgpus_idle_instances_first(rig: Rig) -> None:
    want = Want("gone-pod", ON_GPU, "3g.40gb", 4)
    rig.node.prepare(want, live=[want])  # made for a pod that has gone since
    rig.request(ON_GPU, "disabled")

    rig.switch.report()

    assert read_instances(rig.nvml, ON_GPU) == []
    assert rig.mode(ON_GPU) == [OFF, OFF]
    assert rig.answer(ON_GPU) == (ModeState.DONE, f"GPU 1 ({ON_GPU}) switched out of MIG mode")


def test_an_operators_instance_keeps_the_gpu_in_mig_mode_untouched(kube_api: KubeAPIServer, tmp_path: Path) -> None:
    rig = Rig(kube_api, tmp_path, operator_instance=True)
    rig.request(ON_GPU, "disabled")

    rig.switch.report()

    assert [i.uuid for i in read_instances(rig.nvml, ON_GPU)] == ["MIG-op"]
    assert rig.mode(ON_GPU) == [ON, ON] and rig.requested() == {ON_GPU: False}
    answer = rig.answer(ON_GPU)
    assert answer is not None and answer[0] is ModeState.WAITING and "fgpu did not create (1g.10gb" in answer[1]
    rig.kube.close()


def test_a_reset_another_client_blocks_leaves_the_mode_pending_and_is_retried(rig: Rig) -> None:
    rig.nvml.hold_open(0)  # as DCGM would
    rig.request(OFF_GPU, "enabled")

    rig.switch.report()

    assert rig.mode(OFF_GPU) == [OFF, ON]
    state, message = rig.answer(OFF_GPU) or (None, "")
    assert state is ModeState.RESET_PENDING and "another client holds the GPU (NVML: in use)" in message
    assert rig.requested() == {OFF_GPU: True}
    assert rig.events() == [("Warning", names.EVENT_MIG_MODE_RESET_PENDING)]

    rig.nvml.hold_open(0, False)
    rig.switch.report()
    assert rig.mode(OFF_GPU) == [ON, ON] and rig.requested() == {}


def test_a_platform_that_needs_a_reboot_finishes_the_request_after_it(rig: Rig) -> None:
    rig.nvml.needs_reboot(0)
    rig.request(OFF_GPU, "enabled")
    rig.switch.report()
    assert (rig.answer(OFF_GPU) or (None,))[0] is ModeState.RESET_PENDING

    rig.nvml.reboot(0)
    rig.switch.report()

    assert rig.answer(OFF_GPU) == (ModeState.DONE, f"GPU 0 ({OFF_GPU}) is in MIG mode")
    assert rig.requested() == {}


def test_a_request_for_a_gpu_the_node_lacks_fails_and_is_removed(rig: Rig) -> None:
    rig.request("GPU-nope", "enabled")

    rig.switch.report()

    assert rig.answer("GPU-nope") == (ModeState.FAILED, "this node has no GPU GPU-nope; check the UUID with fgpuctl inspect")
    assert rig.requested() == {}
    assert rig.events() == [("Warning", names.EVENT_MIG_MODE_FAILED)]


# --- the round trip: fgpuctl mig enable against a running agent ------------------------------


@pytest.fixture
def workdir() -> Iterator[str]:
    tmp = tempfile.mkdtemp(prefix="fgpu-mm-")  # short: a unix socket path must fit in 108 bytes
    write_verifying_keys(os.path.join(tmp, "keys"), signing_key("mig-mode"))  # the ledger rebuild checks with them
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def test_fgpuctl_mig_enable_is_carried_out_by_the_nodes_agent(
    kube_api: KubeAPIServer, workdir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kube_api.install_crd(DEVICE_CRD)
    kube_api.put_object("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                                          "spec": {"unschedulable": True}})
    inv = inventory()
    config = AgentConfig(
        node_name=NODE, hook_listen=f"unix://{workdir}/hooks.sock", verifying_keys=os.path.join(workdir, "keys"),
        metrics_listen="", poll_interval_s=0.05, discovery_interval_s=30.0, report_resync_s=30.0,
        admission_sweep_s=60.0, checkpoint_path=os.path.join(workdir, "none"), proc_root=os.path.join(workdir, "proc"),
    )
    agent = Agent(
        config, node_name=NODE, nvml=FakeNVML(inv), topology=InventoryTopology(inv),
        kube=Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=2.0),
    )
    device_path = f"/apis/{names.DEVICE_GROUP}/{names.DEVICE_VERSION}/devices/{NODE}"

    def mig_enabled() -> list[bool]:
        obj = kube_api.get_object(device_path)
        return [bool(g.mig_enabled) for g in from_device_object(obj).gpus] if obj else []

    agent.start()
    try:
        _wait(lambda: mig_enabled() == [False, True])

        code = fgpuctl(["mig", "enable", NODE, "0", "--kubeconfig", kube_api.kubeconfig_path])
        assert code == 0, capsys.readouterr().err
        for loop in agent.loops:  # the agent's next pass; without a poke it comes within report_resync_s
            loop.poke()

        # The Device shows the new mode at once (a rediscovery, not the 30 s discovery interval).
        _wait(lambda: mig_enabled() == [True, True])
        node: Any = kube_api.get_object(f"/api/v1/nodes/{NODE}")
        annotations = node["metadata"].get("annotations") or {}
        assert mode_requests(annotations) == {}
        assert statuses(annotations)[OFF_GPU].state is ModeState.DONE
    finally:
        agent.stop(2)
