"""Dynamic MIG on the running node: instances made for admitted pods, destroyed when no pod holds them.

Glue between the admission ledger (`agent.admissions`: which pods hold which
MIG instances), the node's MIG actions (`agent.mig_nvml.MIGNode`) and the
agent's reporting (docs/mig.md):

- `prepare(wants)`: the hook's step between its two decisions. The caller has
  claimed the placements in the ledger (the pod's holds recorded, no MIG UUID yet)
  and released the ledger's lock: a create takes long, and other admissions must
  not wait behind it. The live holds are read under the GPU's MIG lock, after the
  claim, so a destroy on that GPU either counts the claim or finishes first.
- `pod_stopped(uid, holds)`: the pod's sandbox is gone (PostStopPodSandbox);
  `reconcile()`: at start after the ledger rebuild, and after each sweep. Neither
  holds the ledger's lock across NVML: per GPU, under its MIG lock, the live holds are
  read and the instances to destroy marked gone under the ledger's lock, then
  destroyed without it. An admission naming a marked instance by UUID is refused
  (`destroyed_lately`); one recorded before the mark is counted and keeps it.
- `mark(devices)`: `fgpu_created` on the reported instances: the record's entries
  NVML confirms (never from memory alone; a live allocation alone does not make an
  instance fgpu's, see `agent.mig_manager`).

Every live hold counts, whether it names the instance by placement (one the node
made for the pod) or by its MIG device UUID (`wants_of`).

Which instances may go is decided only when the ledger is complete (rebuilt from
the node's running pods since this process started): before that, a pod the
agent has not counted yet could hold an idle instance. Until then only the
instances a pod that just stopped held are considered.

Lock order: a GPU's MIG lock (`MIGNode.locked`), then the ledger's; never the reverse.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

from agent import nvmlapi
from agent.admissions import AdmissionLedger, Hold
from agent.metrics import AgentMetrics
from agent.mig_manager import Instance, Want, owned_now, resolve_intents
from agent.mig_nvml import MIGError, MIGNode, OwnedFile
from apis.devices import NodeDevices

log = logging.getLogger(__name__)


def wants_of(pod_uid: str, holds: Iterable[Hold]) -> list[Want]:
    """The MIG instances a pod's holds keep: by placement (made for the pod) and by MIG device UUID."""
    return [
        Want(pod_uid, h.gpu_uuid, h.mig_profile, h.mig_placement if h.mig_profile else -1, h.mig_uuid)
        for h in holds if h.mig
    ]


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
        problem = record.problem()
        if problem:  # said once at start; every create is refused with it until it is fixed
            log.warning("%s", problem)

    def live(self) -> list[Want]:
        """Every admitted pod's MIG holds (current when read; the caller's locks decide for how long)."""
        with self._ledger.lock:
            return [w for uid, holds in self._ledger.pods().items() for w in wants_of(uid, holds)]

    @contextlib.contextmanager
    def locked(self, gpu_uuid: str) -> Iterator[None]:
        """The GPU's MIG lock (take it before the ledger's, as the mode switch does)."""
        with self._node.locked(gpu_uuid):
            yield

    def destroyed_lately(self, mig_uuid: str) -> bool:
        """Whether fgpu destroyed or is destroying this MIG device (the hook refuses it by UUID)."""
        return self._node.destroyed_lately(mig_uuid)

    def prepare(self, wants: Sequence[Want]) -> tuple[dict[Want, str], dict[Want, str]]:
        """Each want made ready: (want -> MIG UUID, want -> refusal reason).

        The caller has recorded the pod's claim in the ledger and does not hold the ledger's lock.
        """
        ready: dict[Want, str] = {}
        refused: dict[Want, str] = {}
        for want in wants:
            try:
                ready[want] = self._node.prepare(want, live=self.live)
            except MIGError as err:
                refused[want] = str(err)
        return ready, refused

    def pod_stopped(self, pod_uid: str, holds: Iterable[Hold]) -> list[Instance]:
        """After the pod's ledger entry is released: destroys what fgpu made that no pod holds now."""
        scope = wants_of(pod_uid, holds)
        if self._complete():
            return self._reconcile(scope=None)
        if not scope:
            return []
        return self._reconcile(scope=scope)

    def reconcile(self) -> list[Instance]:
        """Destroys fgpu's instances no live pod holds; nothing until the ledger is complete."""
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
        (before the GPU leaves MIG mode); only once the ledger is complete. The caller holds the
        GPU's lock (`locked`) and the ledger's, so nothing is admitted meanwhile."""
        if not self._complete():
            return []
        return self._node.reconcile([gpu_uuid], self.live, choosing=lambda: self._ledger.lock)

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
            return self._node.reconcile(gpus, self.live, scope=scope, choosing=lambda: self._ledger.lock)
        except nvmlapi.NVMLError as err:
            # A GPU lost mid-way: nothing is destroyed on a guess; the next pass tries again.
            log.warning("MIG reconcile skipped: %s", nvmlapi.error_text(err))
            return []
        except MIGError as err:  # the record cannot be written (its directory is not the agent's alone)
            log.warning("MIG reconcile stopped: %s", err)
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
