"""The agent's side of `fgpuctl mig enable|disable`: MIG mode requests on its Node, carried out when safe.

One pass (`report`, run by a `ReportLoop` every resync period and on each device
change) reads the agent's own Node; for each `fgpu.io/mig-mode.<GPU UUID>` request
it gathers the facts (the ledger's holders, NVML's mode, processes and instances,
whether the node is cordoned) and lets `agent.mig_mode.decide` say whether the GPU
may switch now. With the GPU's MIG lock and then the ledger's held across the check
and the switch (the node's lock order), no container is admitted and no MIG instance
made or destroyed on the GPU meanwhile. Leaving MIG mode, fgpu's own idle instances are
destroyed first (`MIGLifecycle.clear`); an operator's never are.

The outcome goes back on the Node: `fgpu.io/mig-mode-status.<GPU UUID>`
(`apis.mig_mode`) on every change of the answer, an Event when its state changes,
and, once the GPU is in the mode asked (or the request cannot succeed), the request
key is removed. The patch carries the Node's resourceVersion, so a request the
operator rewrote meanwhile is never removed unseen (409; the next pass reads it).
After a switch the NVML worker discovers again, so the Device and the scheduler see
the new mode at once.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

from agent import mig_mode, nvmlapi
from agent.admissions import AdmissionLedger
from agent.kube import Kube
from agent.mig_lifecycle import MIGLifecycle
from agent.mig_mode import Answer, GPUFacts, SetError
from agent.nvmlapi import NVML
from apis import names
from apis.devices import NodeDevices
from apis.mig import mode_request_key, mode_requests
from apis.mig_mode import ModeState, ModeStatus, decode_status, encode_status, status_key

log = logging.getLogger(__name__)

#: Node events go to this namespace, as kubelet's do.
EVENT_NAMESPACE = "default"

_EVENT_REASON = {
    ModeState.DONE: names.EVENT_MIG_MODE_CHANGED,
    ModeState.WAITING: names.EVENT_MIG_MODE_WAITING,
    ModeState.RESET_PENDING: names.EVENT_MIG_MODE_RESET_PENDING,
    ModeState.FAILED: names.EVENT_MIG_MODE_FAILED,
}


class MIGModeSwitch:
    def __init__(
        self,
        *,
        node_name: str,
        kube: Kube,
        nvml: NVML,
        mig: MIGLifecycle,
        ledger: AdmissionLedger,
        devices: Callable[[], NodeDevices],
        ledger_complete: Callable[[], bool],
        changed: Callable[[], None],
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        """`changed`: asks for a fresh discovery (and so a fresh Device report) after a switch."""
        self._node = node_name
        self._kube = kube
        self._nvml = nvml
        self._mig = mig
        self._ledger = ledger
        self._devices = devices
        self._complete = ledger_complete
        self._changed = changed
        self._now = now

    def report(self) -> None:
        """One pass over the Node's MIG mode requests."""
        node = self._kube.get_node(self._node)
        if node is None:
            return  # the Kubernetes reporter warns about a missing Node
        metadata = node.get("metadata") or {}
        annotations = {str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()}
        requests = mode_requests(annotations)
        if not requests:
            return
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        patch: dict[str, str | None] = {}
        news: list[tuple[str, ModeStatus]] = []
        for gpu_uuid, enable in sorted(requests.items()):
            answer = self._answer(gpu_uuid, enable, cordoned=cordoned)
            key = status_key(gpu_uuid)
            before = decode_status(annotations.get(key, ""))
            if annotations.get(key) != encode_status(answer.status):
                patch[key] = encode_status(answer.status)
            if before is None or before.state is not answer.status.state:
                news.append((gpu_uuid, answer.status))
            if answer.finished:
                patch[mode_request_key(gpu_uuid)] = None
        if patch:
            self._kube.patch_node_annotations(self._node, patch, resource_version=str(metadata.get("resourceVersion") or ""))
        for gpu_uuid, status in news:
            (log.info if status.state in (ModeState.DONE, ModeState.WAITING) else log.warning)(
                "MIG mode request %s for GPU %s: %s: %s", status.mode, gpu_uuid, status.state.value, status.message
            )
            self._kube.create_event(EVENT_NAMESPACE, event_body(node, status, now=self._now()))

    def _answer(self, gpu_uuid: str, enable: bool, *, cordoned: bool) -> Answer:
        switched = False
        try:
            # No admission between the check and the switch; the GPU's MIG lock first (the node's lock
            # order), so no create or destroy on the GPU is under way either.
            with self._mig.locked(gpu_uuid), self._ledger.lock:
                answer, switched = self._act(gpu_uuid, enable, cordoned=cordoned)
        except nvmlapi.NVMLError as err:  # the GPU lost mid-way, the driver gone: looked at again next pass
            what = f"GPU {gpu_uuid} is not switched yet: NVML failed ({nvmlapi.error_text(err)}); the agent retries"
            answer = Answer(ModeStatus(mig_mode.mode_word(enable), ModeState.WAITING, what))
        if switched:
            self._changed()
        return answer

    def _act(self, gpu_uuid: str, enable: bool, *, cordoned: bool) -> tuple[Answer, bool]:
        """The answer, and whether NVML was asked to switch (ledger lock held)."""
        devices = self._devices()
        if devices.discovery_error:
            status = ModeStatus(
                mig_mode.mode_word(enable), ModeState.WAITING,
                f"GPU {gpu_uuid} is not switched yet: GPU discovery failed ({devices.discovery_error})",
            )
            return Answer(status), False
        facts = self._facts(devices, gpu_uuid)
        action = mig_mode.decide(enable, facts, gpu_uuid=gpu_uuid, cordoned=cordoned, ledger_complete=self._complete())
        if isinstance(action, mig_mode.Switch) and action.destroy:
            cleared = self._mig.clear(gpu_uuid)
            log.info("GPU %s leaves MIG mode: destroyed fgpu's idle instances %s", gpu_uuid, [i.uuid for i in cleared])
            facts = self._facts(devices, gpu_uuid)
            action = mig_mode.decide(enable, facts, gpu_uuid=gpu_uuid, cordoned=cordoned, ledger_complete=self._complete())
            if isinstance(action, mig_mode.Switch) and action.destroy:
                status = ModeStatus(
                    mig_mode.mode_word(enable), ModeState.WAITING,
                    f"GPU {gpu_uuid} is not switched yet: fgpu's idle MIG instances on it could not all be destroyed "
                    "(the agent's log says why); it retries",
                )
                return Answer(status), True
        if isinstance(action, Answer):
            return action, False
        assert facts is not None
        handle = self._nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        mode = nvmlapi.NVML_DEVICE_MIG_ENABLE if enable else nvmlapi.NVML_DEVICE_MIG_DISABLE
        try:
            activation = int(self._nvml.nvmlDeviceSetMigMode(handle, mode))
        except nvmlapi.NVMLError as err:
            return mig_mode.set_failed(enable, facts, error=_set_error(err), detail=nvmlapi.error_text(err)), False
        after = self._facts(devices, gpu_uuid) or facts
        return mig_mode.after_set(enable, after, activation=activation), True

    def _facts(self, devices: NodeDevices, gpu_uuid: str) -> GPUFacts | None:
        gpu = next((g for g in devices.gpus if g.uuid == gpu_uuid), None)
        if gpu is None:
            return None
        handle = self._nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
        try:
            current, pending = (bool(m == nvmlapi.NVML_DEVICE_MIG_ENABLE) for m in self._nvml.nvmlDeviceGetMigMode(handle))
        except nvmlapi.NVMLError_NotSupported:
            return GPUFacts(uuid=gpu_uuid, index=gpu.index, supported=False, current=False, pending=False)
        holders = tuple(
            sorted(uid for uid, holds in self._ledger.pods().items() if any(h.gpu_uuid == gpu_uuid for h in holds))
        )
        processes = len(self._nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        instances = tuple(self._mig.instances_of(gpu_uuid)) if current else ()
        return GPUFacts(
            uuid=gpu_uuid, index=gpu.index, supported=True, current=current, pending=pending,
            holders=holders, processes=processes, instances=instances,
        )


def _set_error(err: BaseException) -> SetError:
    if isinstance(err, nvmlapi.NVMLError_InUse):
        return SetError.IN_USE
    if isinstance(err, nvmlapi.NVMLError_NotSupported):
        return SetError.NOT_SUPPORTED
    if isinstance(err, nvmlapi.NVMLError_NoPermission):
        return SetError.NO_PERMISSION
    return SetError.OTHER


def event_body(node: dict[str, Any], status: ModeStatus, *, now: datetime.datetime) -> dict[str, Any]:
    metadata = node.get("metadata") or {}
    name = str(metadata.get("name", ""))
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.fgpu-mig-mode.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": metadata.get("uid", "")},
        "type": "Normal" if status.state in (ModeState.DONE, ModeState.WAITING) else "Warning",
        "reason": _EVENT_REASON[status.state],
        "message": status.message,
        "source": {"component": "fgpu-agent", "host": name},
        "reportingComponent": "fgpu-agent",
        "reportingInstance": name,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
