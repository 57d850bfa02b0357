"""The admission sweep's two `PodSource`s: the Kubernetes API and the container runtime (CRI).

Each turns what its peer lists into `PodSeen` values; the decision which
ledger entries to release stays in `agent.admissionsweep.stale_admissions`.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.admissionsweep import PodSeen
from agent.criclient import RuntimeClient, Sandbox
from agent.kube import JSON, Kube

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def pods_seen(items: Iterable[JSON]) -> list[PodSeen]:
    """Pod objects -> PodSeen; an item without a uid cannot match any entry and is skipped."""
    seen: list[PodSeen] = []
    for item in items:
        meta = item.get("metadata")
        status = item.get("status")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        phase = status.get("phase") if isinstance(status, dict) else None
        if isinstance(uid, str) and uid:
            seen.append(PodSeen(uid=uid, finished=phase in FINISHED_PHASES))
    return seen


def sandboxes_seen(sandboxes: Iterable[Sandbox]) -> list[PodSeen]:
    """Sandboxes -> PodSeen: a NOTREADY (stopped) sandbox is a finished pod.

    A pod whose sandbox was recreated is listed twice, the old one stopped;
    `stale_admissions` keeps it while any of them is ready.
    """
    return [PodSeen(uid=s.pod_uid, finished=not s.ready) for s in sandboxes if s.pod_uid]


class KubePods:
    """The pods bound to the node, from the API server."""

    def __init__(self, kube: Kube, *, node_name: str) -> None:
        self._kube = kube
        self._node = node_name
        self.where = f"on node {node_name} (Kubernetes API)"

    def list_pods(self) -> list[PodSeen]:
        return pods_seen(self._kube.list_pods_on_node(self._node))


class RuntimePods:
    """The pod sandboxes of the node's container runtime, over CRI; for an agent without Kubernetes."""

    def __init__(self, runtime: RuntimeClient, *, node_name: str) -> None:
        self._runtime = runtime
        self.where = f"on node {node_name} (container runtime at {runtime.endpoint})"

    def list_pods(self) -> list[PodSeen]:
        return sandboxes_seen(self._runtime.list_pod_sandboxes())
