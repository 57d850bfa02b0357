"""Releasing admission-ledger entries whose PostStopPodSandbox the agent missed.

The runtime proxy sends PostStopPodSandbox once, in the background; if the
agent was restarting or the call failed, the pod's shares would stay held
and later pods on those GPUs would be refused until the agent restarts. So,
with a Kubernetes client, the agent lists the pods bound to its node every
sweep period and releases the entries of pods that are gone or finished
(phase Succeeded or Failed).

An entry admitted within the grace window is never released: the hook
admits a pod before the API server necessarily lists it on this node (and
a list started before the admission cannot know it). A failed list
releases nothing.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from agent.admissions import AdmissionLedger
from agent.kube import JSON, Kube
from agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 120.0
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


class SweepReason(enum.Enum):
    GONE = "gone"
    FINISHED = "finished"


@dataclass(frozen=True)
class PodSeen:
    uid: str
    phase: str = ""


def stale_admissions(
    admitted_at: Mapping[str, float], pods: Iterable[PodSeen], *, listed_at: float, grace_s: float
) -> dict[str, SweepReason]:
    """Pure: which ledger entries to release, given the pods listed on the node at `listed_at`.

    `listed_at` is the ledger-clock time the list started; an entry admitted
    later than `listed_at - grace_s` is kept whatever the list says.
    """
    phases = {p.uid: p.phase for p in pods}
    stale: dict[str, SweepReason] = {}
    for uid, at in admitted_at.items():
        if at > listed_at - grace_s:
            continue
        if uid not in phases:
            stale[uid] = SweepReason.GONE
        elif phases[uid] in FINISHED_PHASES:
            stale[uid] = SweepReason.FINISHED
    return stale


def pods_seen(items: Iterable[JSON]) -> list[PodSeen]:
    """Pod objects -> (uid, phase); an item without a uid cannot match any entry and is skipped."""
    seen: list[PodSeen] = []
    for item in items:
        meta = item.get("metadata")
        status = item.get("status")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        phase = status.get("phase") if isinstance(status, dict) else None
        if isinstance(uid, str) and uid:
            seen.append(PodSeen(uid=uid, phase=phase if isinstance(phase, str) else ""))
    return seen


class AdmissionSweeper:
    """Lists this node's pods and releases the ledger entries `stale_admissions` names."""

    def __init__(
        self,
        kube: Kube,
        *,
        node_name: str,
        ledger: AdmissionLedger,
        metrics: AgentMetrics,
        grace_s: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` must be the ledger's clock: admission times are compared with it."""
        self._kube = kube
        self._node = node_name
        self._ledger = ledger
        self._metrics = metrics
        self._grace = grace_s
        self._clock = clock

    def sweep(self) -> dict[str, SweepReason]:
        """One pass; raises KubeAPIError (releasing nothing) when the pods cannot be listed."""
        listed_at = self._clock()
        pods = pods_seen(self._kube.list_pods_on_node(self._node))
        with self._ledger.lock:
            stale = stale_admissions(self._ledger.admitted_at(), pods, listed_at=listed_at, grace_s=self._grace)
            holds = self._ledger.pods()
            for uid, reason in stale.items():
                self._ledger.release(pod_uid=uid)
                self._metrics.admissions_swept.labels(reason.value).inc()
                gpus = sorted({h.mig_uuid or h.gpu_uuid for h in holds.get(uid, ())})
                log.warning(
                    "pod %s is %s on node %s but still held GPU shares (%s): released; "
                    "its PostStopPodSandbox never reached the agent",
                    uid, "gone" if reason is SweepReason.GONE else "finished", self._node, ", ".join(gpus) or "none",
                )
            if stale:
                self._metrics.admitted_pods.set(len(self._ledger.pods()))
        return stale
