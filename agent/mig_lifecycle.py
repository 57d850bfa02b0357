"""Dynamic MIG on the running node: instances made for admitted pods, destroyed when no pod holds them.

Glue between the admission ledger (`agent.admissions`: which pods hold which
MIG placements), the node's MIG actions (`agent.mig_nvml.MIGNode`) and the
agent's reporting (docs/mig.md):

- `prepare(wants)`: the hook's step between its two decisions, with the
  ledger's lock held by the caller, so an instance made for a pod is recorded
  as that pod's before any other admission or destroy can look at it.
- `pod_stopped(uid, holds)`: the pod's sandbox is gone (PostStopPodSandbox);
  `reconcile()`: at start after the ledger rebuild, and after each sweep.
  Both run under the ledger's lock, with the live wants read under it: a
  destroy can never race the admission of the pod it would take an instance from.
- `mark(devices)`: `fgpu_created` on the reported instances: the record's entries
  NVML confirms (never from memory alone; a live allocation alone does not make an
  instance fgpu's, see `agent.mig_manager`).

Which instances may go is decided only when the ledger is complete (rebuilt from
the node's running pods since this process started): before that, a pod the
agent has not counted yet could hold an idle instance. Until then only the
placements of a pod that just stopped are considered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from agent import nvmlapi
from agent.admissions import AdmissionLedger, Hold
from agent.metrics import AgentMetrics
from agent.mig_manager import Instance, Want, owned_now, resolve_intents
from agent.mig_nvml import MIGError, MIGNode, OwnedFile
from apis.devices import NodeDevices

log = logging.getLogger(__name__)


def wants_of(pod_uid: str, holds: Iterable[Hold]) -> list[Want]:
    """The MIG instances a pod's holds ask the node to keep (those it created for the pod)."""
    return [Want(pod_uid, h.gpu_uuid, h.mig_profile, h.mig_placement) for h in holds if h.mig_profile]


class MIGReporter:
    """A `MIGObserver` that counts every create, destroy and failure and has the node reported again."""

    def __init__(self, metrics: AgentMetrics, *, changed: Callable[[], None]) -> None:
        self._metrics = metrics
        self._changed = changed

    def created(self, instance: Instance, *, pod_uid: str) -> None:
        self._metrics.mig_instances_created.inc()
        self._changed()

    def destroyed(self, instance: Instance) -> None:
        self._metrics.mig_instances_destroyed.inc()
        self._changed()

    def failed(self, *, action: str, reason: str) -> None:
        # A refused create often means the scheduler's view is stale: the next report shows the node as it is.
        self._metrics.mig_instance_failures.labels(action).inc()
        self._changed()


class MIGLifecycle:
    def __init__(
        self,
        node: MIGNode,
        record: OwnedFile,
        *,
        ledger: AdmissionLedger,
        devices: Callable[[], NodeDevices],
        ledger_complete: Callable[[], bool],
    ) -> None:
        self._node = node
        self._record = record
        self._ledger = ledger
        self._devices = devices
        self._complete = ledger_complete

    def live(self) -> list[Want]:
        """Every admitted pod's MIG wants (the ledger's lock makes the answer current to its holder)."""
        with self._ledger.lock:
            return [w for uid, holds in self._ledger.pods().items() for w in wants_of(uid, holds)]

    def prepare(self, wants: Sequence[Want]) -> tuple[dict[Want, str], dict[Want, str]]:
        """Each want made ready: (want -> MIG UUID, want -> refusal reason). The caller holds the ledger's lock."""
        pod = {w.pod_uid for w in wants}
        live = [w for w in self.live() if w.pod_uid not in pod] + list(wants)
        ready: dict[Want, str] = {}
        refused: dict[Want, str] = {}
        for want in wants:
            try:
                ready[want] = self._node.prepare(want, live=live)
            except MIGError as err:
                refused[want] = str(err)
        return ready, refused

    def pod_stopped(self, pod_uid: str, holds: Iterable[Hold]) -> list[Instance]:
        """After the pod's ledger entry is released: destroys what fgpu made that no pod holds now."""
        scope = wants_of(pod_uid, holds)
        with self._ledger.lock:
            if self._complete():
                return self._reconcile(scope=None)
            if not scope:
                return []
            return self._reconcile(scope=scope)

    def reconcile(self) -> list[Instance]:
        """Destroys fgpu's instances no live pod holds; nothing until the ledger is complete."""
        with self._ledger.lock:
            if not self._complete():
                log.debug("MIG reconcile waits for the admission ledger to be rebuilt")
                return []
            return self._reconcile(scope=None)

    def mark(self, devices: NodeDevices) -> NodeDevices:
        """`devices` with `fgpu_created` set on the MIG instances fgpu made (the record, as NVML confirms it)."""
        return mark_created(devices, self._record)

    def instances_of(self, gpu_uuid: str) -> list[tuple[Instance, bool]]:
        """The GPU's MIG instances as NVML shows them, each with whether it is fgpu's."""
        return self._node.owned([gpu_uuid])

    def clear(self, gpu_uuid: str) -> list[Instance]:
        """Destroys fgpu's instances on the GPU that no admitted pod holds and nothing runs on
        (before the GPU leaves MIG mode); only once the ledger is complete."""
        with self._ledger.lock:
            if not self._complete():
                return []
            return self._node.reconcile([gpu_uuid], self.live())

    def _reconcile(self, *, scope: list[Want] | None) -> list[Instance]:
        devices = self._devices()
        if devices.discovery_error:
            return []
        gpus = [g.uuid for g in devices.gpus if g.mig_enabled]
        if scope is not None:
            gpus = [u for u in gpus if any(w.gpu_uuid == u for w in scope)]
        if not gpus:
            return []
        try:
            return self._node.reconcile(gpus, self.live(), scope=scope)
        except nvmlapi.NVMLError as err:
            # A GPU lost mid-way: nothing is destroyed on a guess; the next pass tries again.
            log.warning("MIG reconcile skipped: %s", nvmlapi.error_text(err))
            return []


def mark_created(devices: NodeDevices, record: OwnedFile) -> NodeDevices:
    """`devices` with `fgpu_created` set on the MIG instances `record` lists and NVML confirms.

    The daemon's reports and `fgpu-agent --once` both go through here, so both say the same.
    """
    if not any(g.mig_instances for g in devices.gpus):
        return devices
    instances = [
        Instance(g.uuid, m.gpu_instance_id, m.profile, m.placement_start, uuid=m.uuid)
        for g in devices.gpus for m in g.mig_instances
    ]
    loaded = record.load()
    # An intent not settled yet (an agent that stopped mid-create; the next reconcile records it)
    # already counts: the report must not offer fgpu's instance as an operator's meanwhile.
    recorded = loaded.owned | resolve_intents(instances, loaded.owned, loaded.intents)
    owned = {(o.gpu_uuid, o.gi_id) for o in owned_now(instances, recorded)}
    gpus = tuple(
        replace(g, mig_instances=tuple(
            replace(m, fgpu_created=(g.uuid, m.gpu_instance_id) in owned) for m in g.mig_instances
        )) if g.mig_instances else g
        for g in devices.gpus
    )
    return replace(devices, gpus=gpus)
