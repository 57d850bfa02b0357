"""The cluster as one descheduler cycle sees it: read from the API, loaded into the scheduler's core.

Everything is read afresh each cycle (Nodes, Devices, pods, PodDisruptionBudgets, namespaces, and
the ReplicaSets, StatefulSets and Jobs that own pods), so the view itself keeps no state a
restart could lose. Bound pods are added to the core with their recorded allocations; the ones
`safety.why_not_movable` allows and whose owner exists and recreates them
(`owners.why_not_recreated`) become the planner's candidates, with the budgets that cover them
and their priority. Pending pods addressed to fgpu's scheduler that wait for room the simulation
models (`unschedulable.why_not_actionable`) become the trigger's `Pending`s; the others are kept
in `set_aside` with the reason.

Room already on its way is left to come (`room_coming`): a pending pod kube-scheduler nominated a
node for (`status.nominatedNodeName`: its preemption victims are leaving there), and a pending pod
that fits once the pods being deleted (`deletionTimestamp` set, still shutting down within their
grace: preemption victims, scaled-down replicas, the descheduler's own evictions) are gone. Those
pods still hold their share in the core until they are gone, as on their node.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from apis import names
from apis.allocation import Allocation, decode_allocation
from scheduler_plugin import pods as podutil
from scheduler_plugin.backend_kubernetes import devices_of, node_info
from scheduler_plugin.core.api import NodeName, PodRequest, PodUID
from scheduler_plugin.core.defrag_measure import Fragmentation, measure, workload_of
from scheduler_plugin.core.defrag_planner import Candidate
from scheduler_plugin.core.demand import FULL_PERCENT, Demand, demand_of, share_milli
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.descheduler import budgets, owners, safety, unschedulable
from scheduler_plugin.descheduler.triggers import NodeLoad, Pending

MILLI_PER_PERCENT = 10


class Reader(Protocol):
    def list_nodes(self) -> Any: ...

    def list_devices(self) -> Any: ...

    def list_pods(self) -> Any: ...

    def list_pod_disruption_budgets(self) -> Any: ...

    def list_namespaces(self) -> Any: ...

    def list_replica_sets(self) -> Any: ...

    def list_stateful_sets(self) -> Any: ...

    def list_jobs(self) -> Any: ...


@dataclass
class ClusterView:
    core: Scheduler
    candidates: dict[PodUID, Candidate] = field(default_factory=dict)
    #: budget "namespace/name" -> disruptions it allows now
    allowances: dict[str, int] = field(default_factory=dict)
    #: pod key -> uid, for the Events' involvedObject
    uids: dict[str, str] = field(default_factory=dict)
    #: pod key -> (request, trigger's view, priority) of the pending pods moves may help
    pending: dict[str, tuple[PodRequest, Pending, int]] = field(default_factory=dict)
    #: pending pod key -> why moving pods would not help it
    set_aside: dict[str, str] = field(default_factory=dict)
    #: pending pod key -> why its room is already being freed (not in `pending`)
    room_coming: dict[str, str] = field(default_factory=dict)
    #: uids of every pending pod of fgpu's scheduler, and of every pod bound to a node (the settle check)
    pending_uids: set[str] = field(default_factory=set)
    bound_uids: set[str] = field(default_factory=set)
    loads: list[NodeLoad] = field(default_factory=list)
    idle_by_model: dict[str, int] = field(default_factory=dict)
    fragmentation: Fragmentation = field(default_factory=lambda: Fragmentation(0.0, 0, 0))


def _age_s(pod: Mapping[str, Any], now: datetime.datetime) -> float:
    stamp = podutil.meta(pod).get("creationTimestamp")
    if not stamp:
        return 0.0
    try:
        created = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, (now - created).total_seconds())


def priority_of(pod: Mapping[str, Any]) -> int:
    """`spec.priority` (the admission plugin resolves the class into it); 0 when unset."""
    value = podutil.spec(pod).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def load(reader: Reader, *, policy: str, now: datetime.datetime) -> ClusterView:
    view = ClusterView(core=Scheduler(policy=policy))
    core = view.core
    for node in reader.list_nodes().items:
        core.upsert_node_info(node_info(node))
    for obj in reader.list_devices().items:
        devices = devices_of(obj)
        if devices is not None:
            core.upsert_node_devices(devices)
    namespaces = {
        str(podutil.meta(ns).get("name")): podutil.meta(ns).get("labels") or {} for ns in reader.list_namespaces().items
    }
    pdbs = list(reader.list_pod_disruption_budgets().items)
    view.allowances = budgets.allowances(pdbs)
    known = owners.Owners.of(
        replica_sets=reader.list_replica_sets().items,
        stateful_sets=reader.list_stateful_sets().items,
        jobs=reader.list_jobs().items,
    )
    demands: list[Demand] = []
    #: bound pods being deleted, added to the core after the pending pods were tried without them
    leaving: list[tuple[PodRequest, NodeName, Allocation | None]] = []
    for pod in reader.list_pods().items:
        key = podutil.key(pod)
        view.uids[key] = str(podutil.uid(pod))
        if podutil.node_name(pod):
            view.bound_uids.add(str(podutil.uid(pod)))
        if podutil.holds_resources(pod):
            request, _ = podutil.request_of_bound(pod, rules=None)
            text = podutil.annotations_of(pod).get(names.DEVICE_ALLOCATED)
            try:
                allocation = decode_allocation(text) if text else None
            except ValueError:
                allocation = None
            node = NodeName(podutil.node_name(pod))
            demands.append(demand_of(request))
            if podutil.meta(pod).get("deletionTimestamp"):
                leaving.append((request, node, allocation))
                continue  # never a candidate (`safety.why_not_movable`: being deleted)
            core.add_pod(request, node, allocation)
            covering = budgets.covering(pdbs, pod)
            # The Eviction API refuses a pod under two budgets (500): such a pod cannot move.
            if (
                len(covering) <= 1
                and not safety.why_not_movable(pod, namespaces.get(str(podutil.meta(pod).get("namespace"))))
                and not owners.why_not_recreated(pod, known)
            ):
                view.candidates[request.uid] = Candidate(request=request, node=node, budgets=covering, priority=priority_of(pod))
        elif podutil.wants_us(pod):
            view.pending_uids.add(str(podutil.uid(pod)))
            try:
                request = podutil.request_of(pod, rules=None)
            except ValueError:
                continue
            if request.device is None:
                continue
            demand = demand_of(request)
            demands.append(demand)
            why_not = unschedulable.why_not_actionable(pod)
            if why_not:
                view.set_aside[key] = why_not
                continue
            nominated = (pod.get("status") or {}).get("nominatedNodeName")
            if nominated:
                view.room_coming[key] = f"nominated to node {nominated} (preemption is freeing room there)"
                continue
            view.pending[key] = (
                request,
                Pending(key=key, age_s=_age_s(pod, now), gpu_milli=demand.gpus * share_milli(demand), models=request.model_use),
                priority_of(pod),
            )
    _leave_room_coming(view, leaving)
    view.fragmentation = measure(core, workload_of(demands))
    _loads(view)
    return view


def _leave_room_coming(view: ClusterView, leaving: list[tuple[PodRequest, NodeName, Allocation | None]]) -> None:
    """Moves `pending` pods that fit once the `leaving` pods are gone to `room_coming`, then adds
    the leaving pods to the core: until they are gone they hold their share, on the node and in
    every plan."""
    if leaving:
        for key, (request, _, _) in list(view.pending.items()):
            if view.core.select(request) is not None:
                del view.pending[key]
                view.room_coming[key] = f"fits once the {len(leaving)} pod(s) being deleted are gone"
    for request, node, allocation in leaving:
        view.core.add_pod(request, node, allocation)


def _loads(view: ClusterView) -> None:
    movable_on: Counter[str] = Counter(str(c.node) for c in view.candidates.values() if c.request.device is not None)
    idle: Counter[str] = Counter()
    for node in view.core.node_views():
        usable = [g for g in node.gpus if g.device.healthy and not g.device.mig_enabled and not g.held_externally]
        uids = {share.uid for g in node.gpus for share in g.pods}
        movable = sum(1 for uid in uids if uid in view.candidates)
        for gpu in usable:
            idle[gpu.device.model_label] += (FULL_PERCENT - gpu.allocated_core_percent) * MILLI_PER_PERCENT
        view.loads.append(
            NodeLoad(
                name=str(node.name),
                gpus=len(usable),
                allocated_milli=sum(g.allocated_core_percent for g in node.gpus) * MILLI_PER_PERCENT,
                gpu_pods=len(uids),
                movable_gpu_pods=min(movable, movable_on[str(node.name)]),
            )
        )
    view.idle_by_model = dict(idle)
