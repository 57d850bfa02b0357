"""A cluster snapshot for offline planning: nodes, placed pods (with their GPUs) and disruption budgets.

JSON form (as `fgpuctl defrag-plan --snapshot` reads and `--write-snapshot` writes)::

    {"nodes": [{"name": "n1", "cpu_milli": 96000, "memory_mib": 393216, "gpus": 8, "model": "G2",
                "unusable_gpus": [7], "labels": {"zone": "a"}}],
     "pods": [{"name": "p1", "cpu_milli": 4000, "memory_mib": 8192, "num_gpu": 1, "gpu_milli": 500,
               "gpu_spec": [], "node": "n1", "gpus": [3], "labels": {"app": "web"},
               "node_selector": {"zone": "a"},
               "affinity": [[{"key": "pool", "operator": "NotIn", "values": ["batch"]}]]}],
     "budgets": [{"name": "web", "selector": {"app": "web"}, "max_unavailable": 1},
                 {"name": "ns/db", "selector": {}, "max_unavailable": 0, "pods": ["ns/db-0"]}]}

`unusable_gpus` (optional) are GPUs that take no pod (unhealthy, or held by a pod outside fgpu).
Node `labels`, pod `node_selector` and pod `affinity` (all optional; see `node_constraints.py`)
are given to the scheduler core, so a pod moves only to a node it may run on.
A budget with `pods` covers exactly those pods (a live PodDisruptionBudget whose selector and
namespace were already resolved); without it, the pods whose labels match `selector`.
A snapshot can also come from a trace replay stopped at some arrived % (`snapshot_from_replay`)
or from a live cluster (`fgpuctl/live_snapshot.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from apis.allocation import Allocation, GPUShare
from scheduler_plugin.core.api import LabelRequirement, NodeName, PodRequest, PodUID
from scheduler_plugin.core.fragmentation import TargetWorkload
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.node_constraints import (
    ConstraintError,
    affinity_from_json,
    affinity_to_json,
    labels_from_json,
)
from scheduler_plugin.sim.replay import (
    SIM_GPU_MEMORY_BYTES,
    build_scheduler,
    node_devices,
    place,
    pod_request,
)
from scheduler_plugin.sim.trace import MILLI_PER_GPU, TraceNode, TracePod
from scheduler_plugin.sim.workload import gpu_capacity_milli, order_and_tune, typical_shapes


class SnapshotError(ValueError):
    """A snapshot file is malformed; the message names the entry, the field and the fix."""


@dataclass(frozen=True)
class PlacedPod:
    pod: TracePod
    node: str
    gpus: tuple[int, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    #: spec.nodeSelector
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: required node affinity: OR over terms, AND inside a term
    affinity: tuple[tuple[LabelRequirement, ...], ...] = ()

    def request(self) -> PodRequest:
        """The core's request for this pod, with its node selector and affinity."""
        return replace(pod_request(self.pod), node_selector=dict(self.node_selector), affinity_terms=self.affinity)


@dataclass(frozen=True)
class DisruptionBudget:
    """A PodDisruptionBudget reduced to what planning needs: how many matching pods may move."""

    name: str
    selector: Mapping[str, str]
    max_unavailable: int
    #: when set, exactly the pods (by snapshot name) the budget covers; `selector` is then informative
    pods: frozenset[str] | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        return bool(self.selector) and all(labels.get(k) == v for k, v in self.selector.items())

    def covers(self, placed: PlacedPod) -> bool:
        if self.pods is not None:
            return placed.pod.name in self.pods
        return self.matches(placed.labels)


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[TraceNode, ...]
    pods: tuple[PlacedPod, ...]
    budgets: tuple[DisruptionBudget, ...] = ()
    #: node -> GPU indexes that take no pod (unhealthy, or held outside fgpu)
    unusable_gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: node -> its labels (what node selectors and affinity match)
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def allocation_for(pod: TracePod, node: str, gpus: Sequence[int]) -> Allocation | None:
    if not pod.num_gpu:
        return None
    percent = pod.gpu_milli * 100 // MILLI_PER_GPU
    return Allocation(
        gpus=tuple(
            GPUShare(
                minor=g,
                uuid=f"GPU-{node}-{g}",
                core_percent=percent,
                memory_bytes=SIM_GPU_MEMORY_BYTES * percent // 100,
                memory_ratio_percent=percent,
            )
            for g in gpus
        )
    )


def load_into(core: Scheduler, snapshot: Snapshot) -> None:
    """Binds the snapshot's pods in `core` (which already holds its nodes)."""
    for placed in snapshot.pods:
        core.add_pod(placed.request(), NodeName(placed.node), allocation_for(placed.pod, placed.node, placed.gpus))


def scheduler_for(snapshot: Snapshot, *, policy: str, seed: int = 0, workload: TargetWorkload | None = None) -> Scheduler:
    """A core holding the snapshot; the target workload defaults to the shapes of its pods."""
    if workload is None:
        workload = typical_shapes([p.pod for p in snapshot.pods] or [_NOTHING])
    core = build_scheduler(
        snapshot.nodes, policy=policy, seed=seed, workload=workload, node_labels=snapshot.node_labels
    )
    for node in snapshot.nodes:
        down = set(snapshot.unusable_gpus.get(node.name, ()))
        if down and node.gpus:
            devices = node_devices(node)
            gpus = tuple(
                replace(g, healthy=False, health_reason="unusable") if g.index in down else g for g in devices.gpus
            )
            core.upsert_node_devices(replace(devices, gpus=gpus))
    load_into(core, snapshot)
    return core


_NOTHING = TracePod(name="-", cpu_milli=0, memory_mib=0, num_gpu=1, gpu_milli=MILLI_PER_GPU)


def snapshot_from_replay(
    *, nodes: Sequence[TraceNode], pods: Sequence[TracePod], policy: str, seed: int, arrived_pct: float
) -> Snapshot:
    """Replays the trace (protocol order and tuning) until `arrived_pct` of capacity has arrived."""
    gpu_nodes = tuple(n for n in nodes if n.gpus > 0)
    capacity = gpu_capacity_milli(gpu_nodes)
    run = order_and_tune(pods, capacity_milli=capacity, seed=seed, tune=1.3)
    core = build_scheduler(gpu_nodes, policy=policy, seed=seed, workload=typical_shapes(pods))
    arrived = 0
    placed: list[PlacedPod] = []
    for pod in run.pods:
        if (arrived + pod.total_gpu_milli) / capacity * 100 > arrived_pct:
            break
        arrived += pod.total_gpu_milli
        node = place(core, pod)
        if node is None:
            continue
        found = core.allocation_of(PodUID(pod.name))
        gpus = tuple(s.minor for s in found[1].gpus) if found else ()
        placed.append(PlacedPod(pod=pod, node=str(node), gpus=gpus))
    return Snapshot(nodes=gpu_nodes, pods=tuple(placed))


def _field(entry: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in entry:
        raise SnapshotError(f"{where}: field {key!r} is missing; add it")
    value = entry[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise SnapshotError(f"{where}: field {key!r} = {value!r} is not an integer; write a whole number")
    if kind is not int and not isinstance(value, kind):
        raise SnapshotError(f"{where}: field {key!r} = {value!r} is not a {kind.__name__}")
    return value


def snapshot_from_json(data: Mapping[str, Any]) -> Snapshot:
    try:
        return _from_json(data)
    except ConstraintError as exc:
        raise SnapshotError(str(exc)) from None


def _from_json(data: Mapping[str, Any]) -> Snapshot:
    if not isinstance(data, Mapping):
        raise SnapshotError("snapshot: the document is not a JSON object with nodes, pods and budgets")
    nodes = []
    unusable: dict[str, tuple[int, ...]] = {}
    node_labels: dict[str, dict[str, str]] = {}
    for i, entry in enumerate(data.get("nodes") or []):
        where = f"nodes[{i}]"
        trace_node = TraceNode(
            name=_field(entry, "name", str, where),
            cpu_milli=_field(entry, "cpu_milli", int, where),
            memory_mib=_field(entry, "memory_mib", int, where),
            gpus=_field(entry, "gpus", int, where),
            model=str(entry.get("model", "")),
        )
        nodes.append(trace_node)
        down = entry.get("unusable_gpus") or []
        if not isinstance(down, list) or any(isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < trace_node.gpus for g in down):
            raise SnapshotError(
                f"{where} ({trace_node.name}): unusable_gpus {down!r} must list GPU indexes 0..{trace_node.gpus - 1}"
            )
        if down:
            unusable[trace_node.name] = tuple(sorted(set(down)))
        labels = labels_from_json(entry.get("labels"), where=f"{where} ({trace_node.name})", field="labels")
        if labels:
            node_labels[trace_node.name] = labels
    if not nodes:
        raise SnapshotError("snapshot: 'nodes' is empty; list at least one node")
    known = {n.name: n for n in nodes}
    pods = []
    for i, entry in enumerate(data.get("pods") or []):
        where = f"pods[{i}]"
        name = _field(entry, "name", str, where)
        node = _field(entry, "node", str, where)
        if node not in known:
            raise SnapshotError(f"{where} ({name}): node {node!r} is not in 'nodes'; add the node or fix the name")
        gpus = tuple(int(g) for g in entry.get("gpus", []))
        num_gpu = _field(entry, "num_gpu", int, where)
        if len(gpus) != num_gpu or any(not 0 <= g < known[node].gpus for g in gpus):
            raise SnapshotError(
                f"{where} ({name}): gpus {list(gpus)} must list {num_gpu} GPU index(es) of node {node} "
                f"(0..{known[node].gpus - 1})"
            )
        pods.append(
            PlacedPod(
                pod=TracePod(
                    name=name,
                    cpu_milli=_field(entry, "cpu_milli", int, where),
                    memory_mib=_field(entry, "memory_mib", int, where),
                    num_gpu=num_gpu,
                    gpu_milli=_field(entry, "gpu_milli", int, where),
                    gpu_spec=tuple(entry.get("gpu_spec", [])),
                ),
                node=node,
                gpus=gpus,
                labels=dict(entry.get("labels", {})),
                node_selector=labels_from_json(entry.get("node_selector"), where=f"{where} ({name})", field="node_selector"),
                affinity=affinity_from_json(entry.get("affinity"), where=f"{where} ({name})"),
            )
        )
    budgets = []
    for i, entry in enumerate(data.get("budgets") or []):
        where = f"budgets[{i}]"
        members = entry.get("pods")
        if members is not None and (not isinstance(members, list) or not all(isinstance(m, str) for m in members)):
            raise SnapshotError(f"{where}: field 'pods' = {members!r} is not a list of pod names")
        budget = DisruptionBudget(
            name=_field(entry, "name", str, where),
            selector=dict(_field(entry, "selector", dict, where)),
            max_unavailable=_field(entry, "max_unavailable", int, where),
            pods=None if members is None else frozenset(members),
        )
        if budget.max_unavailable < 0:
            raise SnapshotError(f"{where}: max_unavailable = {budget.max_unavailable}; use 0 or more")
        budgets.append(budget)
    return Snapshot(
        nodes=tuple(nodes), pods=tuple(pods), budgets=tuple(budgets), unusable_gpus=unusable, node_labels=node_labels
    )


def snapshot_to_json(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "name": n.name,
                "cpu_milli": n.cpu_milli,
                "memory_mib": n.memory_mib,
                "gpus": n.gpus,
                "model": n.model,
                **({"unusable_gpus": list(snapshot.unusable_gpus[n.name])} if snapshot.unusable_gpus.get(n.name) else {}),
                **({"labels": dict(snapshot.node_labels[n.name])} if snapshot.node_labels.get(n.name) else {}),
            }
            for n in snapshot.nodes
        ],
        "pods": [
            {
                "name": p.pod.name,
                "cpu_milli": p.pod.cpu_milli,
                "memory_mib": p.pod.memory_mib,
                "num_gpu": p.pod.num_gpu,
                "gpu_milli": p.pod.gpu_milli,
                "gpu_spec": list(p.pod.gpu_spec),
                "node": p.node,
                "gpus": list(p.gpus),
                "labels": dict(p.labels),
                **({"node_selector": dict(p.node_selector)} if p.node_selector else {}),
                **({"affinity": affinity_to_json(p.affinity)} if p.affinity else {}),
            }
            for p in snapshot.pods
        ],
        "budgets": [
            {
                "name": b.name,
                "selector": dict(b.selector),
                "max_unavailable": b.max_unavailable,
                **({"pods": sorted(b.pods)} if b.pods is not None else {}),
            }
            for b in snapshot.budgets
        ],
    }


def load_snapshot(path: str | Path) -> Snapshot:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read snapshot ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}); write a JSON snapshot") from exc
    return snapshot_from_json(data)
