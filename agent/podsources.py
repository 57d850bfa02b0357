"""The admission sweep's and the ledger rebuild's two `PodSource`s: the Kubernetes API and the container runtime (CRI).

Each turns what its peer lists into `PodSeen` values (UID, finished, name,
annotations); the decisions stay in `agent.admissionsweep.stale_admissions`
(which entries to release) and `agent.ledger_rebuild.restored_admissions`
(which entries to restore after a restart).
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
        meta = meta if isinstance(meta, dict) else {}
        uid = meta.get("uid")
        phase = status.get("phase") if isinstance(status, dict) else None
        if isinstance(uid, str) and uid:
            seen.append(PodSeen(
                uid=uid,
                finished=phase in FINISHED_PHASES,
                name=_name(meta.get("namespace"), meta.get("name")),
                annotations=_text_map(meta.get("annotations")),
                started=_has_container(status),
                created=str(meta.get("creationTimestamp") or ""),
            ))
    return seen


def sandboxes_seen(sandboxes: Iterable[Sandbox]) -> list[PodSeen]:
    """Sandboxes -> PodSeen: a NOTREADY (stopped) sandbox is a finished pod.

    A pod whose sandbox was recreated is listed twice, the old one stopped;
    `stale_admissions` keeps it while any of them is ready, and the rebuild
    reads the ready one.
    """
    return [
        PodSeen(
            uid=s.pod_uid,
            finished=not s.ready,
            name=_name(s.pod_namespace, s.pod_name),
            annotations=s.annotations,
            created=f"{s.created_at_ns:020d}" if s.created_at_ns else "",
        )
        for s in sandboxes
        if s.pod_uid
    ]


def _has_container(status: object) -> bool:
    """Whether kubelet reports a created container (one with a containerID) for the pod."""
    if not isinstance(status, dict):
        return False
    for key in ("containerStatuses", "initContainerStatuses"):
        for entry in status.get(key) or []:
            if isinstance(entry, dict) and entry.get("containerID"):
                return True
    return False


def _name(namespace: object, name: object) -> str:
    if not isinstance(name, str) or not name:
        return ""
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def _text_map(value: object) -> dict[str, str]:
    # The API only stores strings here; anything else is not an annotation we could verify.
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


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
