"""Which pods to move off which node: the defrag planner's candidate blocker sets, cheapest first.

Pure ranking over the core's state; nothing here changes the core. `defrag_planner` simulates the
sets this returns, so a set that looks good here and fails there costs one simulation, and a node
left out here is never tried: the rules below only drop what can never work.

Per node (`blocker_sets`):
  * a node the pending pod could not take even empty is left out: the core's own filter calls its
    reason unresolvable (labels, taints, model, GPU count, more CPU or memory than the node has);
  * per GPU that could take one card of the pending pod, the movable pods to clear, chosen two
    ways: the fewest pods (largest first), and the pods easiest to place again (pods free to use
    any GPU model before those held to some models, then the smallest first). On a plain cluster
    both give one pod; on a cluster where some pods may use only one model (gpuspec), the fewest
    can be exactly the pods that fit nowhere else;
  * the `demand.gpus` GPUs cheapest to clear, plus pods holding CPU or host memory the pending pod
    needs (CPU-only pods first).
Both sets of every examined node are returned, ranked by pods to move, then by the pods among them
held to some GPU models, then the GPUs they hold, then the node name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_plugin.core import memory_only
from scheduler_plugin.core.api import GPUView, NodeName, PodRequest, PodShareView, PodUID
from scheduler_plugin.core.demand import FULL_PERCENT, Demand
from scheduler_plugin.core.scheduler import Scheduler

#: nodes whose GPUs are examined in detail per plan, best first by a cheap bound
EXAMINE_LIMIT = 64


@dataclass(frozen=True)
class Candidate:
    """A bound pod the planner may move; `budgets` names the disruption budgets covering it."""

    request: PodRequest
    node: NodeName
    budgets: tuple[str, ...] = ()
    #: the pod's `spec.priority`; `plan_room(max_priority=...)` leaves higher ones in place
    priority: int = 0


ShareOrder = Callable[[PodShareView, Mapping[PodUID, Candidate]], tuple[object, ...]]


def _largest_first(share: PodShareView, movable: Mapping[PodUID, Candidate]) -> tuple[object, ...]:
    return (-share.core_percent, share.uid)


def _easiest_first(share: PodShareView, movable: Mapping[PodUID, Candidate]) -> tuple[object, ...]:
    candidate = movable.get(share.uid)
    held = bool(candidate and candidate.request.model_use)
    return (held, share.core_percent, share.uid)


ORDERS: tuple[ShareOrder, ...] = (_largest_first, _easiest_first)


def model_held(candidate: Candidate) -> bool:
    return bool(candidate.request.model_use)


def blocker_sets(
    core: Scheduler,
    pending: PodRequest,
    demand: Demand,
    candidates: Mapping[PodUID, Candidate],
    node_left: Mapping[NodeName, int],
) -> list[list[Candidate]]:
    """Blocker sets per promising node, cheapest first (see the module docstring)."""
    state = core.state
    by_node: dict[NodeName, list[Candidate]] = {}
    movable_core: Counter[NodeName] = Counter()
    for candidate in candidates.values():
        by_node.setdefault(candidate.node, []).append(candidate)
        found = core.allocation_of(candidate.request.uid)
        if found is not None:
            movable_core[candidate.node] += sum(s.core_percent for s in found[1].gpus)
    need_total = demand.gpus * _core_to_clear(demand)
    bounds: list[tuple[int, NodeName]] = []
    for node, pods in by_node.items():
        slot = state.slot_of.get(node)
        if slot is None or not state.active[slot] or state.gpu_count[slot] < demand.gpus:
            continue
        if node_left.get(node, 1) <= 0:
            continue
        free = int(state.node_core_free[slot])
        if free + movable_core[node] < need_total:
            continue
        # Cheap bound: fewer movable GPU pods and more free share first.
        bounds.append((len(pods) * FULL_PERCENT - free, node))
    bounds.sort()
    ranked = [node for _, node in bounds]
    # The core's own verdict: a node whose reason no departure can change is never worth a move.
    never = {v.node_name for v in core.filter(pending, ranked) if not v.feasible and v.unresolvable}
    chosen = [node for node in ranked if node not in never][:EXAMINE_LIMIT]
    views = {view.name: view for view in core.node_views(chosen)}
    options: dict[frozenset[PodUID], tuple[int, int, int, str, list[Candidate]]] = {}
    for node in chosen:
        view = views.get(node)
        if view is None:
            continue
        movable = {c.request.uid: c for c in by_node[node]}
        for order in ORDERS:
            blockers = _gpu_blockers(view.gpus, demand, movable, order)
            if blockers is None:
                continue
            blockers += _host_blockers(core, node, demand, movable, blockers)
            if not blockers or len(blockers) > node_left.get(node, len(blockers)):
                continue
            key = frozenset(b.request.uid for b in blockers)
            held = sum(b.request.device.gpus if b.request.device else 0 for b in blockers)
            options.setdefault(key, (len(blockers), sum(map(model_held, blockers)), held, node, blockers))
    return [o[4] for o in sorted(options.values(), key=lambda o: o[:4])]


def _gpu_blockers(
    gpus: Sequence[GPUView], demand: Demand, movable: Mapping[PodUID, Candidate], order: ShareOrder
) -> list[Candidate] | None:
    """The movable pods to clear from the `demand.gpus` GPUs cheapest to clear; None when too few can be."""
    costs: list[tuple[int, int, int, int, list[Candidate]]] = []
    for column, gpu in enumerate(gpus):
        device = gpu.device
        if not device.healthy or device.mig_enabled or gpu.held_externally:
            continue
        if demand.model_use and device.model_label not in demand.model_use:
            continue
        free_core = FULL_PERCENT - gpu.allocated_core_percent
        free_mem = device.memory_bytes - gpu.allocated_memory_bytes
        need_core, need_mem = _core_to_clear(demand), demand.memory_need_on(device.memory_bytes)
        # A share with compute never joins a memory-only one (core/memory_only.py); the view has no
        # burst limits, so 0% reads as memory only here, and the simulation is the judge.
        apart = 0 if memory_only.is_memory_only(demand) else sum(1 for p in gpu.pods if p.core_percent == 0)
        clear: list[Candidate] = []
        for share in sorted(gpu.pods, key=lambda p: order(p, movable)):
            roomy = free_core >= need_core and free_mem >= need_mem
            if roomy and not apart:
                break
            if roomy and share.core_percent != 0:
                continue  # only memory-only shares are left to clear
            candidate = movable.get(share.uid)
            if candidate is None:
                continue
            clear.append(candidate)
            free_core += share.core_percent
            free_mem += share.memory_bytes
            apart -= 1 if apart and share.core_percent == 0 else 0
        if free_core < need_core or free_mem < need_mem or apart:
            continue
        costs.append((len(clear), sum(map(model_held, clear)), gpu.allocated_core_percent, column, clear))
    if len(costs) < demand.gpus:
        return None
    chosen = sorted(costs, key=lambda c: c[:4])[: demand.gpus]
    unique = {c.request.uid: c for *_, clear in chosen for c in clear}
    return list(unique.values())


def _core_to_clear(demand: Demand) -> int:
    """Compute a card must have free for one card of `demand`: all of it for a memory-only share."""
    return FULL_PERCENT if memory_only.is_memory_only(demand) else demand.core_need()


def _host_blockers(
    core: Scheduler, node: NodeName, demand: Demand, movable: Mapping[PodUID, Candidate], leaving: Sequence[Candidate]
) -> list[Candidate]:
    """More pods to move when the node is short of CPU or host memory once `leaving` left (best effort:
    the simulation is the judge)."""
    state = core.state
    slot = state.slot_of[node]
    gone = {c.request.uid for c in leaving}
    cpu_short = mem_short = 0
    if state.cpu_alloc[slot] > 0:
        cpu_short = demand.cpu_milli - int(state.cpu_free[slot]) - sum(c.request.cpu_milli for c in leaving)
    if state.host_mem_alloc[slot] > 0:
        mem_short = demand.host_memory_bytes - int(state.host_mem_free[slot]) - sum(c.request.memory_bytes for c in leaving)
    extra: list[Candidate] = []
    # CPU-only pods first, then those giving back most.
    rest = sorted(
        (c for uid, c in movable.items() if uid not in gone),
        key=lambda c: (c.request.device is not None, -c.request.cpu_milli, -c.request.memory_bytes, c.request.uid),
    )
    for candidate in rest:
        if cpu_short <= 0 and mem_short <= 0:
            break
        if (cpu_short > 0 and candidate.request.cpu_milli > 0) or (mem_short > 0 and candidate.request.memory_bytes > 0):
            extra.append(candidate)
            cpu_short -= candidate.request.cpu_milli
            mem_short -= candidate.request.memory_bytes
    return extra
