"""Releasing admission-ledger entries whose PostStopPodSandbox the agent missed.

The runtime proxy sends PostStopPodSandbox once, in the background; if the
agent was restarting or the call failed, the pod's shares would stay held
and later pods on those GPUs would be rejected until the agent restarts. So
the agent asks a `PodSource` every sweep period which pods exist on its node
and releases the entries of pods that are gone or finished. Two sources
(`agent.podsources`): with a Kubernetes client, the pods bound to the node
(finished = phase Succeeded or Failed); without one, the container runtime's
pod sandboxes over CRI (finished = no sandbox of the pod is ready).

An entry admitted within the grace window is never released: the hook
admits a pod before the source necessarily lists it (and a list started
before the admission cannot know it). A failed list releases nothing.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agent.admissions import AdmissionLedger
from agent.isolation import registry
from agent.isolation.registry import IsolationPaths
from agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 120.0


class SweepReason(enum.Enum):
    GONE = "gone"
    FINISHED = "finished"


@dataclass(frozen=True)
class PodSeen:
    """A pod a source listed on this node; `finished` when it will run nothing more.

    The sweep needs only `uid` and `finished`; the ledger rebuild
    (`agent.ledger_rebuild`) also reads the pod's annotations, where its signed
    GPU allocation is, so one listing serves both.
    """

    uid: str
    finished: bool = False
    #: "namespace/name" for logs; empty when the source did not say.
    name: str = ""
    #: Excluded from the hash: a dict cannot be hashed, and the UID already identifies the pod.
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: A container of the pod was created, so the hook admitted it (Kubernetes: a container status
    #: with a containerID; the runtime: the sandbox has a container).
    started: bool = False
    #: When the pod (Kubernetes) or its sandbox (runtime) was created, as a sortable text; "" unknown.
    created: str = ""
    #: The pod sandbox this listing is of (runtime only; the API does not say): "" unknown.
    sandbox_id: str = ""


class PodSource(Protocol):
    """Where the sweep learns which pods exist on the node."""

    #: For logs: where the pods were listed, e.g. "on node gpu-1 (Kubernetes API)".
    @property
    def where(self) -> str: ...

    def list_pods(self) -> list[PodSeen]:
        """Every pod of the node; raises (KubeAPIError, RuntimeUnavailable) rather than return a partial list."""
        ...


def stale_admissions(
    admitted_at: Mapping[str, float], pods: Iterable[PodSeen], *, listed_at: float, grace_s: float
) -> dict[str, SweepReason]:
    """Pure: which ledger entries to release, given the pods listed on the node at `listed_at`.

    `listed_at` is the ledger-clock time the list started; an entry admitted
    later than `listed_at - grace_s` is kept whatever the list says. A pod
    listed twice (a CRI pod with an old and a new sandbox) is finished only
    if every listing says so.
    """
    finished: dict[str, bool] = {}
    for p in pods:
        finished[p.uid] = finished.get(p.uid, True) and p.finished
    stale: dict[str, SweepReason] = {}
    for uid, at in admitted_at.items():
        if at > listed_at - grace_s:
            continue
        if uid not in finished:
            stale[uid] = SweepReason.GONE
        elif finished[uid]:
            stale[uid] = SweepReason.FINISHED
    return stale


class AdmissionSweeper:
    """Lists the node's pods from `source` and releases the ledger entries `stale_admissions` names."""

    def __init__(
        self,
        source: PodSource,
        *,
        ledger: AdmissionLedger,
        metrics: AgentMetrics,
        grace_s: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        isolation_paths: Callable[[], IsolationPaths | None] = lambda: None,
    ) -> None:
        """`clock` must be the ledger's clock: admission times are compared with it.

        `isolation_paths`: where the isolation backends keep per-pod state on the host; each sweep
        has every backend remove what pods no longer on the node left (their PostStopPodSandbox
        may never have reached the agent). None: nothing is removed.
        """
        self._isolation_paths = isolation_paths
        self._source = source
        self._ledger = ledger
        self._metrics = metrics
        self._grace = grace_s
        self._clock = clock

    def sweep(self) -> dict[str, SweepReason]:
        """One pass; raises the source's error (releasing nothing) when the pods cannot be listed."""
        listed_at = self._clock()
        pods = self._source.list_pods()
        with self._ledger.lock:
            stale = stale_admissions(self._ledger.admitted_at(), pods, listed_at=listed_at, grace_s=self._grace)
            holds = self._ledger.pods()
            for uid, reason in stale.items():
                self._ledger.release(pod_uid=uid)
                self._metrics.admissions_swept.labels(reason.value).inc()
                gpus = sorted({h.mig_uuid or h.gpu_uuid for h in holds.get(uid, ())})
                log.warning(
                    "pod %s is %s %s but still held GPU shares (%s): released; "
                    "its PostStopPodSandbox never reached the agent",
                    uid, reason.value, self._source.where, ", ".join(gpus) or "none",
                )
            if stale:
                self._metrics.admitted_pods.set(len(self._ledger.pods()))
            live = {p.uid for p in pods if not p.finished} | set(self._ledger.pods())
        paths = self._isolation_paths()
        if paths is not None:
            for backend in registry.backends():
                for name in backend.remove_leftovers(paths, live_uids=live, min_age_s=self._grace):
                    log.info("isolation %s: removed %s, its pod is no longer %s", backend.name, name, self._source.where)
        return stale
