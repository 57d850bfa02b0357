"""Which pods the descheduler may move at all, and which pods the simulation can stand for (pure).

A pod may move only when (1) its controller owner is a built-in one that recreates it elsewhere:
an `apps/v1` ReplicaSet or StatefulSet, or a `batch/v1` Job (whether that owner exists and will
recreate it is `owners.why_not_recreated`, which looks it up); a bare pod, a DaemonSet's (it would
come back on the same node), a static pod, or a look-alike kind of another API group (a Volcano
`batch.volcano.sh` Job restarts the whole job) never moves; (2) it is opted in: the label
`fgpu.io/defrag: allow` on the pod, or on its namespace when the pod has no such label; (3) the
simulation can place its recreated copy as the cluster would (`unmodelled` is empty). It must also be bound, running, and
not being deleted. The pod's own label, when present, decides: any other value (`deny`) keeps it
in place even in an opted-in namespace; the namespace's label is the default. Pod authors can opt
their own pods in or out; they cannot opt others in.

`unmodelled` names what a pod needs that the scheduler core (and so the planner's simulation)
does not model: volumes from claims (a local PV pins the pod to one node, a zonal one to a zone),
required pod (anti-)affinity, DoNotSchedule topology spreads, resource claims, and any resource
other than GPU, CPU and memory. A pending pod with one of them may wait for that, not for GPU
room; a victim with one may find no place the simulation promised it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis import names
from scheduler_plugin.core import standalone_limits

#: (apiVersion, kind) of the controllers that recreate an evicted pod elsewhere.
RECREATING_OWNERS = frozenset({("apps/v1", "ReplicaSet"), ("apps/v1", "StatefulSet"), ("batch/v1", "Job")})

#: Resources the core models: CPU, memory and fgpu's GPU resources (nvidia.com/mig-* by prefix).
_MODELLED_RESOURCES = frozenset({"cpu", "memory", names.NVIDIA_GPU, *names.KOORDINATOR_RESOURCES})


def controller_ref(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with `controller: true` (the API server allows at most one)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def owner_kind(pod: Mapping[str, Any]) -> str:
    ref = controller_ref(pod)
    return str(ref.get("kind") or "") if ref else ""


def opted_in(labels: Mapping[str, Any] | None) -> bool:
    return (labels or {}).get(names.DEFRAG_OPT_IN_LABEL) == names.DEFRAG_OPT_IN_VALUE


def may_move(pod_labels: Mapping[str, Any] | None, namespace_labels: Mapping[str, Any] | None) -> bool:
    """The pod's own label, when it has one, decides (`allow`, or any other value: no); the
    namespace's label is the default for pods without one."""
    if names.DEFRAG_OPT_IN_LABEL in (pod_labels or {}):
        return opted_in(pod_labels)
    return opted_in(namespace_labels)


def modelled_resource(name: str) -> bool:
    return name in _MODELLED_RESOURCES or name.startswith(names.NVIDIA_MIG_RESOURCE_PREFIX)


def unmodelled(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """What the pod needs that the simulation does not model, one phrase each (empty: nothing)."""
    needs = list(standalone_limits.unsupported(pod))
    spec = pod.get("spec") or {}
    others: set[str] = set()
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:
            resources = (container or {}).get("resources") or {}
            for part in ("requests", "limits"):
                others.update(n for n in (resources.get(part) or {}) if not modelled_resource(str(n)))
    if others:
        needs.append(f"resources the scheduler core does not model: {', '.join(sorted(others))}")
    return tuple(needs)


def why_not_movable(pod: Mapping[str, Any], namespace_labels: Mapping[str, Any] | None) -> str:
    """"" when nothing on the pod itself forbids a move, else the reason (for logs and dry-run Events).

    Its owner must still be looked up (`owners.why_not_recreated`)."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return "being deleted"
    if (pod.get("status") or {}).get("phase") != "Running" or not (pod.get("spec") or {}).get("nodeName"):
        return "not running on a node"
    ref = controller_ref(pod)
    if ref is None:
        return "owner none (bare pod) does not recreate it elsewhere"
    owner = (str(ref.get("apiVersion") or ""), str(ref.get("kind") or ""))
    if owner not in RECREATING_OWNERS:
        return f"owner {owner[1]} ({owner[0] or 'no apiVersion'}) does not recreate it elsewhere"
    if not may_move(meta.get("labels"), namespace_labels):
        return (
            f"not opted in ({names.DEFRAG_OPT_IN_LABEL}={names.DEFRAG_OPT_IN_VALUE} on the pod, or on its namespace "
            "with no other value on the pod)"
        )
    needs = unmodelled(pod)
    if needs:
        return "needs what the simulation does not model: " + "; ".join(needs)
    return ""
