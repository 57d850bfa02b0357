"""A live cluster's state as the defrag planner's snapshot (pure: `cluster_state` does the reading).

Each GPU pod becomes a placed pod named `namespace/name` on the GPU indexes it holds. Its per-GPU
share is the larger of its core % and its fraction of that GPU's memory, rounded up to 1/100 GPU,
so a pod holding little core but much memory is not taken for a small one. Unhealthy GPUs and
GPUs held by pods outside fgpu take nothing. Reserved-but-unbound pods never move.

From the API (`ApiState`) the snapshot also has each node's allocatable CPU/memory and labels,
each pod's CPU/memory requests, model constraints, labels, `spec.nodeSelector` and required node
affinity (matchExpressions, and matchFields on `metadata.name`), CPU-only pods on GPU nodes, and
the PodDisruptionBudgets. A pod that has a node selector or affinity the scheduler's parser
rejects (another matchFields key, a bad operator) is pinned: where it may go is unknown. From a
scheduler (GetNodeState rows only) CPU/memory, node labels, selectors and affinity are unknown
(not tracked, not checked), there are no budgets, and each pod is kept on its current GPU model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fgpuctl.cluster_state import ApiState, NodeRow, PodShare
from scheduler_plugin import pods as pod_objects
from scheduler_plugin.core.api import LabelRequirement, PodRequest
from scheduler_plugin.core.labels import matches
from scheduler_plugin.sim.snapshot import DisruptionBudget, PlacedPod, Snapshot
from scheduler_plugin.sim.trace import MIB, MILLI_PER_GPU, TraceNode, TracePod

JSON = dict[str, Any]

#: the budget that keeps reserved-but-unbound pods where they are
IN_FLIGHT = "in-flight binds"
#: the budget that keeps pods whose node selector or affinity could not be read where they are
UNREADABLE = "unreadable node constraints"
_PDB_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class LiveStateError(ValueError):
    """The live state can't be planned on; the message names the object, the field and the fix."""


@dataclass(frozen=True)
class LiveSnapshot:
    snapshot: Snapshot
    #: what the operator should know about how the snapshot was built (printed with the plan)
    notes: tuple[str, ...] = ()


@dataclass
class _Holding:
    share: PodShare
    node: str
    gpus: list[int] = field(default_factory=list)
    milli: int = 0


def snapshot_from_scheduler(rows: Sequence[NodeRow]) -> LiveSnapshot:
    live = _build(rows, api=None)
    notes = (
        "no PodDisruptionBudgets with --scheduler (the scheduler does not hold them); "
        "use --kubeconfig to respect them",
        "CPU/memory unknown with --scheduler: planned on GPUs only, each pod kept on its GPU model",
        "node labels, nodeSelector and node affinity unknown with --scheduler: moves are not checked against "
        "them; use --kubeconfig to respect them",
        *live.notes,
    )
    return LiveSnapshot(live.snapshot, notes)


def snapshot_from_api(state: ApiState) -> LiveSnapshot:
    return _build(state.rows, api=state)


def _build(rows: Sequence[NodeRow], *, api: ApiState | None) -> LiveSnapshot:
    notes: list[str] = []
    nodes: list[TraceNode] = []
    unusable: dict[str, tuple[int, ...]] = {}
    holdings: dict[str, _Holding] = {}
    for row in sorted(rows, key=lambda r: r.name):
        gpus = sorted(row.gpus, key=lambda g: g.device.index)
        models = sorted({g.model for g in gpus})
        if len(models) > 1:
            notes.append(f"node {row.name} mixes GPU models {', '.join(models)}; planned as {models[0]}")
        info = api.nodes.get(row.name) if api else None
        nodes.append(
            TraceNode(
                name=row.name,
                cpu_milli=info.cpu_milli if info else 0,
                memory_mib=info.memory_bytes // MIB if info else 0,
                gpus=len(gpus),
                model=models[0] if models else "",
            )
        )
        down = tuple(i for i, g in enumerate(gpus) if not g.device.healthy or g.held_externally)
        if down:
            unusable[row.name] = down
        for position, gpu in enumerate(gpus):
            for share in gpu.pods:
                holding = holdings.setdefault(share.uid, _Holding(share=share, node=row.name))
                holding.gpus.append(position)
                holding.milli = max(holding.milli, _share_milli(share, gpu_memory_bytes=gpu.device.memory_bytes))
    if not nodes:
        raise LiveStateError("the cluster reports no GPU nodes; check that the fgpu agents run and report Devices")
    model_of = {n.name: n.model for n in nodes}
    placed: list[PlacedPod] = []
    names_by_uid: dict[str, str] = {}
    unreadable: dict[str, str] = {}
    for uid, holding in sorted(holdings.items(), key=lambda kv: _name(kv[1].share)):
        obj = api.pods.get(uid) if api else None
        placed.append(_placed(holding, obj, model=model_of[holding.node], unreadable=unreadable))
        names_by_uid[uid] = placed[-1].pod.name
    node_labels: dict[str, dict[str, str]] = {}
    if api is not None:
        on_nodes = set(model_of)
        for uid, obj in sorted(api.pods.items()):
            if uid not in holdings and pod_objects.node_name(obj) in on_nodes:
                placed.append(_cpu_only(obj, unreadable=unreadable))
                names_by_uid[uid] = placed[-1].pod.name
        for name in on_nodes:
            info = api.nodes.get(name)
            if info is not None and info.labels:
                node_labels[name] = dict(info.labels)
    budgets: list[DisruptionBudget] = []
    assumed = frozenset(_name(h.share) for h in holdings.values() if h.share.assumed)
    if assumed:
        budgets.append(DisruptionBudget(name=IN_FLIGHT, selector={}, max_unavailable=0, pods=assumed))
    if unreadable:
        budgets.append(DisruptionBudget(name=UNREADABLE, selector={}, max_unavailable=0, pods=frozenset(unreadable)))
        first = min(unreadable)
        notes.append(
            f"{len(unreadable)} pod(s) pinned: their node selector or affinity could not be read "
            f"(e.g. {first}: {unreadable[first]})"
        )
    if api is not None:
        for pdb in api.budgets:
            budgets.append(budget_from_pdb(pdb, pods=api.pods, names_by_uid=names_by_uid))
        notes.append(f"{len(api.budgets)} PodDisruptionBudget(s) respected")
    snapshot = Snapshot(
        nodes=tuple(nodes), pods=tuple(placed), budgets=tuple(budgets), unusable_gpus=unusable, node_labels=node_labels
    )
    return LiveSnapshot(snapshot, tuple(notes))


def _name(share: PodShare) -> str:
    return f"{share.namespace}/{share.name}"


def _share_milli(share: PodShare, *, gpu_memory_bytes: int) -> int:
    milli = share.core_percent * MILLI_PER_GPU // 100
    if gpu_memory_bytes > 0:
        milli = max(milli, math.ceil(share.memory_bytes * MILLI_PER_GPU / gpu_memory_bytes))
    return min(MILLI_PER_GPU, max(10, math.ceil(milli / 10) * 10))


def _placed(holding: _Holding, obj: Mapping[str, Any] | None, *, model: str, unreadable: dict[str, str]) -> PlacedPod:
    name = _name(holding.share)
    cpu = memory_mib = 0
    spec: tuple[str, ...] = (model,) if model else ()
    labels: dict[str, str] = {}
    request: PodRequest | None = None
    if obj is not None:
        request = _request(obj, name=name, unreadable=unreadable)
        cpu, memory_mib = request.cpu_milli, math.ceil(request.memory_bytes / MIB)
        spec = tuple(sorted(request.model_use))
        labels = _labels(obj)
    pod = TracePod(
        name=name,
        cpu_milli=cpu,
        memory_mib=memory_mib,
        num_gpu=len(holding.gpus),
        gpu_milli=holding.milli,
        gpu_spec=spec,
    )
    return PlacedPod(
        pod=pod,
        node=holding.node,
        gpus=tuple(sorted(holding.gpus)),
        labels=labels,
        node_selector=dict(request.node_selector) if request else {},
        affinity=request.affinity_terms if request else (),
    )


def _cpu_only(obj: Mapping[str, Any], *, unreadable: dict[str, str]) -> PlacedPod:
    name = pod_objects.key(obj)
    request = _request(obj, name=name, unreadable=unreadable)
    pod = TracePod(
        name=name,
        cpu_milli=request.cpu_milli,
        memory_mib=math.ceil(request.memory_bytes / MIB),
        num_gpu=0,
        gpu_milli=0,
    )
    return PlacedPod(
        pod=pod,
        node=pod_objects.node_name(obj),
        gpus=(),
        labels=_labels(obj),
        node_selector=dict(request.node_selector),
        affinity=request.affinity_terms,
    )


def _request(obj: Mapping[str, Any], *, name: str, unreadable: dict[str, str]) -> PodRequest:
    """The scheduler's own reading of a bound pod; records in `unreadable` why its node constraints are unknown."""
    request, problem = pod_objects.request_of_bound(obj, rules=None)
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    constrained = bool(spec.get("nodeSelector")) or (
        isinstance(node_affinity, Mapping) and bool(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    )
    # A rejected pod comes back without its selector and affinity: moving it could break them.
    if problem and constrained:
        unreadable[name] = problem
    return request


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    raw = pod_objects.meta(obj).get("labels")
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def budget_from_pdb(
    pdb: Mapping[str, Any], *, pods: Mapping[str, Mapping[str, Any]], names_by_uid: Mapping[str, str]
) -> DisruptionBudget:
    """A policy/v1 PodDisruptionBudget as the planner's budget over the snapshot's pods.

    How many covered pods may move: the budget's `status.disruptionsAllowed` when the disruption
    controller has seen its current generation; otherwise worked out from the spec, counting every
    running pod it selects as healthy (maxUnavailable, or selected pods minus minAvailable; 0 when
    neither is set, to be safe). Percentages round up, as Kubernetes does.
    """
    meta = pdb.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    name = f"{namespace}/{meta.get('name') or ''}"
    spec = pdb.get("spec") or {}
    selector = spec.get("selector")
    requirements = _requirements(selector, where=f"PodDisruptionBudget {name}")
    selected = [
        uid
        for uid, obj in pods.items()
        if requirements is not None
        and (pod_objects.meta(obj).get("namespace") or "default") == namespace
        and all(matches(_labels(obj), r) for r in requirements)
    ]
    status = pdb.get("status") or {}
    observed = status.get("observedGeneration")
    if "disruptionsAllowed" in status and observed is not None and observed >= (meta.get("generation") or 0):
        allowed = int(status["disruptionsAllowed"])
    elif spec.get("maxUnavailable") is not None:
        allowed = _count(spec["maxUnavailable"], total=len(selected), where=f"PodDisruptionBudget {name}: spec.maxUnavailable")
    elif spec.get("minAvailable") is not None:
        minimum = _count(spec["minAvailable"], total=len(selected), where=f"PodDisruptionBudget {name}: spec.minAvailable")
        allowed = len(selected) - minimum
    else:
        allowed = 0
    match_labels = (selector or {}).get("matchLabels") or {}
    return DisruptionBudget(
        name=name,
        selector={str(k): str(v) for k, v in match_labels.items()},
        max_unavailable=max(0, allowed),
        pods=frozenset(names_by_uid[uid] for uid in selected if uid in names_by_uid),
    )


def _requirements(selector: Any, *, where: str) -> list[LabelRequirement] | None:
    """The selector's requirements; None for a null selector, which selects no pod."""
    if selector is None:
        return None
    if not isinstance(selector, Mapping):
        raise LiveStateError(f"{where}: spec.selector = {selector!r} is not a label selector; fix the budget")
    out = [LabelRequirement(key=str(k), operator="In", values=(str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    for i, entry in enumerate(selector.get("matchExpressions") or []):
        operator = str(entry.get("operator") or "")
        if operator not in _PDB_OPERATORS:
            raise LiveStateError(
                f"{where}: spec.selector.matchExpressions[{i}].operator = {operator!r}; "
                f"use one of {', '.join(_PDB_OPERATORS)}"
            )
        out.append(LabelRequirement(key=str(entry.get("key") or ""), operator=operator, values=tuple(map(str, entry.get("values") or ()))))
    return out


def _count(value: Any, *, total: int, where: str) -> int:
    text = str(value).strip()
    try:
        if text.endswith("%"):
            return math.ceil(total * int(text[:-1]) / 100)
        return int(text)
    except ValueError:
        raise LiveStateError(f"{where} = {value!r} is not a whole number or a percentage such as 25%; fix the budget") from None
