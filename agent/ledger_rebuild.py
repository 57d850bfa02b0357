"""Rebuilding the admission ledger after an agent start, from the running pods' verified allocations.

The ledger (`agent.admissions`) lives in memory, so a restarted agent would
forget every pod it admitted and let a new pod overcommit their GPUs. At
start it asks its `PodSource` which pods run on the node: the Kubernetes
API; with `runtimeEndpoint` too, the container runtime over CRI when the API
fails or does not answer within seconds (`agent.podsources.EitherPods`,
decided by `agent.listing_choice`, and the log says which); without
Kubernetes, the runtime alone. It restores an entry
for each one whose allocation verifies: signed with one of the scheduler's keys
for that pod UID on this node (`apis.signing.verify_pod_annotations`). An allocation
that does not verify is not counted and is logged with the pod and the
reason, so a forged annotation cannot block GPUs. What a pod holds is
`agent.hook.holds_of`, which counts a share even on a GPU that is unhealthy
now: a rebuild can only make GPUs look fuller, never freer.

Order at start (`agent.daemon.Agent.start`): the NVML worker first, then one
rebuild once discovery has produced devices, then the hook server. The
rebuild needs the devices (to resolve shares to GPUs) and the verifying keys;
while either is missing it waits (the hook rejects allocations then anyway),
and the agent's hook sees the node as not ready until one rebuild has been
tried with both in hand.

A failed listing (no source it has answered) does not stop the agent: it
logs a warning, and the rebuild is retried with the admission sweep, on its
backoff and period, until one listing succeeds. Until then the hook rejects
GPU allocations (kubelet retries them); pods without one are not affected.
The ledger must never count less than what runs, so there is no other way
out of this wait.

Only pods the hook could have admitted together are restored: a pod with a
created container first (it was admitted), then by age; a verified pod that
would overcommit a GPU on top of those is one the hook rejected (a stale
scheduler view), and counting it would block the pods really running. Restoring merges: an entry a
real admission recorded in the meantime wins, and the rebuild never releases
anything (releasing is the sweep's job).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from agent.admissions import AdmissionLedger, Hold
from agent.admissionsweep import PodSeen, PodSource
from agent.hook import holds_of
from agent.metrics import AgentMetrics
from apis import names
from apis.allocation import AllocationError
from apis.devices import NodeDevices
from apis.signing import SignatureError, SigningKeyError, VerifyingKeys, verify_pod_annotations

log = logging.getLogger(__name__)


class SkipReason(enum.Enum):
    #: Finished pod (phase Succeeded/Failed) or no READY sandbox: it holds nothing any more.
    FINISHED = "finished"
    #: The signature does not match this pod and node, or the signed value cannot be read.
    UNVERIFIED = "unverified"
    #: Verified, but lists no GPU, or none of its GPUs is on the node now.
    HOLDS_NOTHING = "holds-nothing"
    #: Verified, but counting it would overcommit a GPU the pods restored before it hold: the hook
    #: rejected it (a stale scheduler view), and it waits on the node for kubelet's retries.
    OVERCOMMIT = "overcommit"


@dataclass(frozen=True)
class Skipped:
    """A listed pod with an allocation that the rebuild did not count, and why."""

    uid: str
    #: "namespace/name (uid)", for logs.
    pod: str
    reason: SkipReason
    detail: str


@dataclass(frozen=True)
class Restored:
    """The rebuild's decision: (pod UID, holds) to restore, and the pods left out."""

    entries: tuple[tuple[str, tuple[Hold, ...]], ...]
    skipped: tuple[Skipped, ...]
    #: pod UID -> the live sandbox it was listed in, where the source said (the runtime does)
    sandboxes: Mapping[str, str] = field(default_factory=dict)


def restored_admissions(
    pods: Iterable[PodSeen], *, key: VerifyingKeys, node_name: str, devices: NodeDevices
) -> Restored:
    """Pure: which ledger entries the pods listed on `node_name` stand for.

    A pod without an allocation annotation is neither restored nor skipped. A
    pod listed more than once (a CRI pod whose sandbox was recreated) counts
    once, from a listing that is not finished.
    """
    by_uid: dict[str, list[PodSeen]] = {}
    for p in pods:
        if p.uid and names.DEVICE_ALLOCATED in p.annotations:
            by_uid.setdefault(p.uid, []).append(p)
    verified: list[tuple[PodSeen, tuple[Hold, ...]]] = []
    skipped: list[Skipped] = []
    for uid, listed in by_uid.items():
        live = [p for p in listed if not p.finished]
        pod = live[0] if live else listed[0]
        who = f"{pod.name} ({uid})" if pod.name else uid
        if not live:
            skipped.append(Skipped(uid, who, SkipReason.FINISHED, "the pod is finished"))
            continue
        try:
            allocation = verify_pod_annotations(key, pod_uid=uid, node_name=node_name, annotations=pod.annotations)
        except (SignatureError, AllocationError) as err:
            skipped.append(Skipped(uid, who, SkipReason.UNVERIFIED, str(err)))
            continue
        if allocation is None:  # unreachable: the annotation is there; kept for the type checker
            continue
        holds = holds_of(allocation, devices) if allocation.gpus else ()
        if not holds:
            detail = "its allocation lists no GPU" if not allocation.gpus else (
                f"none of its GPUs ({', '.join(allocation.uuids)}) is on this node now"
            )
            skipped.append(Skipped(uid, who, SkipReason.HOLDS_NOTHING, detail))
            continue
        verified.append((pod, holds))
    entries = _admissible(verified, devices, skipped)
    sandboxes = {pod.uid: pod.sandbox_id for pod, _ in verified if pod.sandbox_id}
    return Restored(entries=tuple(entries), skipped=tuple(skipped), sandboxes=sandboxes)


def _admissible(
    verified: list[tuple[PodSeen, tuple[Hold, ...]]], devices: NodeDevices, skipped: list[Skipped]
) -> list[tuple[str, tuple[Hold, ...]]]:
    """The verified pods the hook could have admitted together, as it did: a pod with a running
    container first (it was admitted), then the oldest. A pod that would overcommit a GPU on top
    of those is one the hook rejected; counting it would block the pods really running."""
    memory = {g.uuid: g.memory_bytes for g in devices.gpus}
    core: dict[str, int] = {}
    used: dict[str, int] = {}
    migs: set[tuple[str, str | int]] = set()
    out: list[tuple[str, tuple[Hold, ...]]] = []
    for pod, holds in sorted(verified, key=lambda e: (not e[0].started, e[0].created or "~", e[0].uid)):
        over = [
            h.gpu_uuid for h in holds
            if (h.mig and not migs.isdisjoint(_mig_keys(h))) or (not h.mig and (
                core.get(h.gpu_uuid, 0) + h.core_percent > 100
                or used.get(h.gpu_uuid, 0) + h.memory_bytes > memory.get(h.gpu_uuid, 0)
            ))
        ]
        if over:
            who = f"{pod.name} ({pod.uid})" if pod.name else pod.uid
            skipped.append(Skipped(pod.uid, who, SkipReason.OVERCOMMIT, (
                f"its share of {', '.join(sorted(set(over)))} does not fit beside the pods restored before it; "
                "the hook rejected it, and it holds nothing"
            )))
            continue
        for h in holds:
            if h.mig:
                migs.update(_mig_keys(h))
            else:
                core[h.gpu_uuid] = core.get(h.gpu_uuid, 0) + h.core_percent
                used[h.gpu_uuid] = used.get(h.gpu_uuid, 0) + h.memory_bytes
        out.append((pod.uid, holds))
    return out


def _mig_keys(hold: Hold) -> set[tuple[str, str | int]]:
    """What a MIG hold takes on its GPU: the instance by UUID, and the placement of one the node creates.

    Keyed by GPU: the same placement (or a not-yet-made `profile@start`) on two GPUs is two instances.
    """
    keys: set[tuple[str, str | int]] = set()
    if hold.mig_uuid:
        keys.add((hold.gpu_uuid, hold.mig_uuid))
    if hold.mig_profile:
        keys.add((hold.gpu_uuid, hold.mig_placement))
    return keys


class LedgerRebuilder:
    """Lists the node's pods once and restores the ledger entries `restored_admissions` names; thread-safe.

    `pending` until one listing succeeded; `tried` once an attempt with devices
    and key in hand has ended, whatever its outcome (the hook waits for that).
    """

    def __init__(
        self,
        source: PodSource,
        *,
        ledger: AdmissionLedger,
        metrics: AgentMetrics,
        node_name: str,
        key: Callable[[], VerifyingKeys],
        devices: Callable[[], NodeDevices],
    ) -> None:
        """`key` raises SigningKeyError while the key cannot be read; `devices` is the node's current picture."""
        self._source = source
        self._ledger = ledger
        self._metrics = metrics
        self._node = node_name
        self._key = key
        self._devices = devices
        self._lock = threading.Lock()
        self.pending = True
        self.tried = False

    @property
    def where(self) -> str:
        """Where the pods are listed from, for messages."""
        return self._source.where

    def rebuild(self) -> bool:
        """One attempt unless done already; True once done.

        Returns False without listing while GPU discovery has not succeeded or
        the key cannot be read. Raises the source's error (KubeAPIError,
        RuntimeUnavailable) when the listing fails, restoring nothing.
        """
        with self._lock:
            if not self.pending:
                return True
            devices = self._devices()
            if devices.discovery_error:
                return False
            try:
                key = self._key()
            except SigningKeyError as err:
                log.debug("admission ledger not restored yet: %s", err)
                return False
            try:
                pods = self._source.list_pods()
            except Exception as err:
                if not self.tried:
                    log.warning(
                        "cannot list the pods %s to restore the admission ledger (%s); GPU allocations are "
                        "rejected (kubelet retries) until a retry with the admission sweep succeeds, since "
                        "admitting them without the pods already running could overcommit a GPU",
                        self._source.where, err,
                    )
                self.tried = True
                raise
            try:
                decision = restored_admissions(pods, key=key, node_name=self._node, devices=devices)
            except Exception:
                # A bug here must not hold GPU pods back for good: go on with an empty record, loudly.
                self.tried = True
                self.pending = False
                log.exception("admission ledger rebuild failed; GPU pods are admitted without the pods already running")
                return True
            restored = self._ledger.restore(decision.entries, sandboxes=decision.sandboxes)
            self.pending = False
            self.tried = True
        self._report(decision, restored)
        return True

    def _report(self, decision: Restored, restored: list[str]) -> None:
        for s in decision.skipped:
            if s.reason is SkipReason.FINISHED:
                continue
            self._metrics.admissions_not_restored.labels(s.reason.value).inc()
            if s.reason is SkipReason.UNVERIFIED:
                log.warning(
                    "pod %s runs %s with a GPU allocation that does not verify: %s; "
                    "not counted in the admission ledger", s.pod, self._source.where, s.detail,
                )
            else:
                log.info("pod %s: %s; it holds no GPU share", s.pod, s.detail)
        self._metrics.admissions_restored.inc(len(restored))
        self._metrics.admitted_pods.set(len(self._ledger.pods()))
        kept = len(decision.entries) - len(restored)
        log.info(
            "admission ledger restored: %d running pod(s) with a verified allocation %s%s",
            len(restored), self._source.where,
            f" ({kept} admitted again since the start and kept as admitted)" if kept else "",
        )
