"""Is a pending pod waiting for room the descheduler can make? (pure, over the API's pod dict)

Moving pods frees GPU, CPU and memory, and the planner's simulation models only those (plus
node selection: selectors, node affinity, taints, host ports, cordons). A pod that waits for
anything else (a PersistentVolumeClaim that does not exist, a volume pinned to another node, pod
anti-affinity, a topology spread, another extended resource) would be "placed" by the simulation
and never bind: other tenants' pods would be evicted for nothing. So a pending pod is acted for
only when

1. nothing in its spec is outside the model (`safety.unmodelled`), and
2. the scheduler said it lacks modelled room: its `PodScheduled` condition (kube-scheduler writes
   it on every failed attempt, with the reasons of every plugin and of fgpu's filter) is
   `False`/`Unschedulable`, names at least one shortage of GPU, CPU or memory, and names no
   reason outside the model. A pod with no `PodScheduled` condition at all was never tried by
   kube-scheduler (standalone fgpu-scheduler records Events, not the condition, and refuses the
   spec constraints of 1. itself), so 1. alone decides for it.

The reasons are matched in the words kube-scheduler's in-tree plugins and fgpu's filter
(`core/reasons.py`) use. Only the part before "preemption:" is read: that part is the filters'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from scheduler_plugin.descheduler import safety

#: `Insufficient <resource>` (kube-scheduler's NodeResourcesFit, fgpu's "insufficient cpu: ..."):
#: the resource must be one the core models.
_INSUFFICIENT = re.compile(r"\binsufficient ([a-z0-9][\w./-]*)", re.IGNORECASE)
#: fgpu's own GPU shortages (core/reasons.py): a node's GPUs are too full, not the wrong kind.
_GPU_SHORTAGE = re.compile(
    r"GPUs? fully free|fitting GPUs|GPUs can take a card|no GPU has \d+% core|no free MIG instance|node cannot take \d",
    re.IGNORECASE,
)
#: Reasons of in-tree plugins the simulation does not model (VolumeBinding, VolumeRestrictions,
#: VolumeZone, NodeVolumeLimits, InterPodAffinity, PodTopologySpread, DynamicResources).
_UNMODELLED = re.compile(
    r"volume|persistentvolume|\bpvc|claim|\bdisk|storage|pod affinity|anti-affinity|topology spread|spread constraint",
    re.IGNORECASE,
)


def scheduled_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "PodScheduled":
            return condition
    return None


def why_not_for_room(message: str) -> str:
    """"" when a FailedScheduling message says only that modelled room is short, else why not."""
    filters = message.split("preemption:", 1)[0]
    unmodelled = _UNMODELLED.search(filters)
    if unmodelled:
        return f"the scheduler names a reason the simulation does not model ({unmodelled.group(0)!r})"
    short = [m.group(1).rstrip(".,:;") for m in _INSUFFICIENT.finditer(filters)]
    other = sorted({name for name in short if not safety.modelled_resource(name)})
    if other:
        return f"the scheduler names a shortage of {', '.join(other)}, which the simulation does not model"
    if not short and not _GPU_SHORTAGE.search(filters):
        return "the scheduler names no shortage of GPU, CPU or memory"
    return ""


def why_not_actionable(pod: Mapping[str, Any]) -> str:
    """"" when moving pods may let this pending pod bind, else the reason (for logs)."""
    needs = safety.unmodelled(pod)
    if needs:
        return "it needs what the simulation does not model: " + "; ".join(needs)
    condition = scheduled_condition(pod)
    if condition is None:
        return ""
    if condition.get("status") != "False" or condition.get("reason") != "Unschedulable":
        return f"its PodScheduled condition is {condition.get('status')}/{condition.get('reason')}, not False/Unschedulable"
    return why_not_for_room(str(condition.get("message") or ""))
