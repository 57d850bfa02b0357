"""Which pods the descheduler may move at all (pure, over the API's pod and namespace dicts).

A pod may move only when (1) its owner recreates it: a ReplicaSet, a StatefulSet, or a Job (which
starts a replacement while its backoffLimit allows); a bare pod, a DaemonSet's (it would come back
on the same node) or a static pod never moves; and (2) it is opted in: the label
`fgpu.io/defrag: allow` on the pod or on its namespace. It must also be bound, running, and not
being deleted. Pod authors can opt their own pods in, which only lets them be moved; they cannot
opt others in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis import names

RECREATING_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "Job"})


def owner_kind(pod: Mapping[str, Any]) -> str:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind") or "")
    return ""


def opted_in(labels: Mapping[str, Any] | None) -> bool:
    return (labels or {}).get(names.DEFRAG_OPT_IN_LABEL) == names.DEFRAG_OPT_IN_VALUE


def why_not_movable(pod: Mapping[str, Any], namespace_labels: Mapping[str, Any] | None) -> str:
    """"" when the pod may move, else the reason (for logs and dry-run Events)."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return "being deleted"
    if (pod.get("status") or {}).get("phase") != "Running" or not (pod.get("spec") or {}).get("nodeName"):
        return "not running on a node"
    kind = owner_kind(pod)
    if kind not in RECREATING_OWNERS:
        return f"owner {kind or 'none (bare pod)'} does not recreate it elsewhere"
    if not (opted_in(meta.get("labels")) or opted_in(namespace_labels)):
        return f"not opted in ({names.DEFRAG_OPT_IN_LABEL}={names.DEFRAG_OPT_IN_VALUE} on the pod or its namespace)"
    return ""
