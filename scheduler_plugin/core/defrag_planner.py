"""Choosing pod moves that make room for one pending pod: the planner both defragmenters drive.

The churn replay (`sim/churn.py`) and the live controller (`descheduler/`) call `plan_room` with
the real core holding the cluster, the pods they may move (`Candidate`: whose owner recreates
them and that are opted in; the caller decides) and what each disruption budget still allows.
It only *chooses*: acting (evicting, rate limits, dry-run) belongs to the caller's evictor.

How it chooses (greedy, bounded):
  1. Per node that could host the pending pod (GPU count, model), the fewest movable pods whose
     leaving frees enough GPU share (core and memory) on the GPUs cheapest to clear, plus, when
     the node is short of CPU or host memory, the movable pods that give most of it back.
  2. Nodes ranked by how many pods must move (then by how much GPU they hold); the first
     `max_tries` whose moves fit the move budget and the disruption budgets are *simulated* on
     the core, in the order the cluster would run them: the blockers leave, the pending pod is
     scheduled (kube-scheduler takes the older, pending pod before the recreated ones), then each
     recreated blocker is scheduled, all with the core's own `select`/`reserve` (so model, node
     selector, affinity and the policy all apply). A plan is returned only when every step
     placed its pod; the core is always rolled back to where it was.

`plan_consolidation` is the explicit consolidation mode's question to the same planner: which
moves empty `node` of GPU pods (for whole-GPU or multi-GPU pods to come). No pod is pending, so
the simulation schedules the evicted pods as the cluster would with nothing holding the node:
a plan is returned only when the policy itself puts every one of them on another node.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from apis.allocation import Allocation
from scheduler_plugin.core.api import GPUView, NodeName, PodRequest, PodUID, SchedulingError
from scheduler_plugin.core.demand import FULL_PERCENT, Demand, demand_of
from scheduler_plugin.core.scheduler import Scheduler

#: nodes simulated at most per plan (the ranking is cheap, a simulation is a few core calls per pod)
DEFAULT_MAX_TRIES = 6
#: nodes whose GPUs are examined in detail per plan, best first by a cheap bound
_EXAMINE_LIMIT = 64


@dataclass(frozen=True)
class Candidate:
    """A bound pod the planner may move; `budgets` names the disruption budgets covering it."""

    request: PodRequest
    node: NodeName
    budgets: tuple[str, ...] = ()
    #: the pod's `spec.priority`; `plan_room(max_priority=...)` leaves higher ones in place
    priority: int = 0


@dataclass(frozen=True)
class Move:
    uid: PodUID
    key: str
    from_node: NodeName
    #: where the simulation scheduled its recreated copy
    to_node: NodeName


class Refusal(enum.Enum):
    """Why no plan: the label metrics and Events carry."""

    FITS_ALREADY = "fits-already"
    NOT_A_GPU_POD = "not-a-gpu-pod"
    NO_CANDIDATE_NODE = "no-candidate-node"
    OVER_BUDGET = "over-move-or-disruption-budget"
    SIMULATION_FAILED = "simulation-failed"
    #: a GPU pod on the node may not move (owner, opt-in): it cannot be emptied
    PINNED = "pod-not-movable"
    NOTHING_TO_MOVE = "nothing-to-move"


@dataclass(frozen=True)
class Plan:
    #: the pod room is made for; None for a consolidation
    pending: PodUID | None
    #: where the pending pod landed in the simulation (the emptied node for a consolidation)
    target: NodeName
    moves: tuple[Move, ...]
    #: one line per node simulated before this plan and rejected (for Events and `fgpuctl`)
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoPlan:
    reason: Refusal
    #: one line per simulated node that failed, for Events and `fgpuctl`
    detail: tuple[str, ...] = ()


def plan_room(
    core: Scheduler,
    pending: PodRequest,
    candidates: Mapping[PodUID, Candidate],
    *,
    max_moves: int,
    allowances: Mapping[str, int] | None = None,
    node_moves_left: Mapping[NodeName, int] | None = None,
    max_tries: int = DEFAULT_MAX_TRIES,
    max_priority: int | None = None,
) -> Plan | NoPlan:
    """The moves that let `pending` (not counted in `core`) be scheduled; see the module docstring.

    `allowances`: budget name -> disruptions it still allows (a budget not named allows none).
    `node_moves_left`: node -> moves its rate limit still allows there (absent: unlimited).
    `max_priority`: the pending pod's priority; candidates above it never move for it (as
    kube-scheduler's preemption never disrupts a higher-priority pod for a lower one). None: any.
    """
    if max_priority is not None:
        candidates = {uid: c for uid, c in candidates.items() if c.priority <= max_priority}
    demand = demand_of(pending)
    if not demand.wants_gpu:
        return NoPlan(Refusal.NOT_A_GPU_POD)
    if core.select(pending) is not None:
        return NoPlan(Refusal.FITS_ALREADY)
    options = _rank(core, demand, candidates, node_moves_left or {})
    if not options:
        return NoPlan(Refusal.NO_CANDIDATE_NODE)
    allowed = dict(allowances or {})
    details: list[str] = []
    tried = 0
    for blockers in options:
        if len(blockers) > max_moves or not _within_budgets(blockers, allowed):
            continue
        if tried >= max_tries:
            break
        tried += 1
        outcome = _simulate(core, pending, blockers)
        if isinstance(outcome, str):
            details.append(outcome)
            continue
        return replace(outcome, skipped=tuple(details))
    if not tried:
        return NoPlan(Refusal.OVER_BUDGET)
    return NoPlan(Refusal.SIMULATION_FAILED, tuple(details))


def plan_consolidation(
    core: Scheduler,
    node: NodeName,
    candidates: Mapping[PodUID, Candidate],
    *,
    max_moves: int,
    allowances: Mapping[str, int] | None = None,
) -> Plan | NoPlan:
    """The moves that leave `node` with no GPU pod; see the module docstring."""
    views = core.node_views([node])
    if not views:
        return NoPlan(Refusal.NO_CANDIDATE_NODE, (f"{node}: no such GPU node",))
    uids = sorted({share.uid for gpu in views[0].gpus for share in gpu.pods})
    if not uids:
        return NoPlan(Refusal.NOTHING_TO_MOVE)
    pinned = [uid for uid in uids if uid not in candidates or candidates[uid].node != node]
    if pinned:
        return NoPlan(Refusal.PINNED, tuple(f"{node}: pod {uid} may not move" for uid in pinned))
    # Larger pods first: they are the hardest to place once the others took the holes.
    blockers = sorted((candidates[uid] for uid in uids), key=lambda c: (-_gpu_share(c), c.request.uid))
    if len(blockers) > max_moves or not _within_budgets(blockers, dict(allowances or {})):
        return NoPlan(Refusal.OVER_BUDGET)
    originals = [(b, found[1] if (found := core.allocation_of(b.request.uid)) else None) for b in blockers]
    for blocker in blockers:
        core.remove_pod(blocker.request.uid)
    placed: list[PodUID] = []
    try:
        moves: list[Move] = []
        for blocker in blockers:
            to = _schedule(core, blocker.request)
            if to is None:
                return NoPlan(Refusal.SIMULATION_FAILED, (f"{node}: pod {blocker.request.key} would fit nowhere once evicted",))
            placed.append(blocker.request.uid)
            if to == node:
                return NoPlan(
                    Refusal.SIMULATION_FAILED, (f"{node}: the policy would put {blocker.request.key} back on {node}",)
                )
            moves.append(Move(blocker.request.uid, blocker.request.key, node, to))
        return Plan(pending=None, target=node, moves=tuple(moves))
    finally:
        for uid in placed:
            core.remove_pod(uid)
        for blocker, allocation in originals:
            core.add_pod(blocker.request, blocker.node, allocation)


def _gpu_share(candidate: Candidate) -> int:
    device = candidate.request.device
    if device is None:
        return 0
    return device.gpus * (FULL_PERCENT if device.whole else device.core_percent)


def _within_budgets(blockers: Sequence[Candidate], allowed: Mapping[str, int]) -> bool:
    wanted = Counter(name for b in blockers for name in b.budgets)
    return all(allowed.get(name, 0) >= count for name, count in wanted.items())


def _rank(
    core: Scheduler, demand: Demand, candidates: Mapping[PodUID, Candidate], node_left: Mapping[NodeName, int]
) -> list[list[Candidate]]:
    """Blocker sets per promising node, cheapest first."""
    state = core.state
    by_node: dict[NodeName, list[Candidate]] = {}
    movable_core: Counter[NodeName] = Counter()
    for candidate in candidates.values():
        by_node.setdefault(candidate.node, []).append(candidate)
        found = core.allocation_of(candidate.request.uid)
        if found is not None:
            movable_core[candidate.node] += sum(s.core_percent for s in found[1].gpus)
    need_total = demand.gpus * demand.core_need()
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
    chosen = [node for _, node in bounds[:_EXAMINE_LIMIT]]
    views = {view.name: view for view in core.node_views(chosen)}
    options: list[tuple[int, int, str, list[Candidate]]] = []
    for node in chosen:
        view = views.get(node)
        if view is None:
            continue
        movable = {c.request.uid: c for c in by_node[node]}
        blockers = _gpu_blockers(view.gpus, demand, movable)
        if blockers is None:
            continue
        blockers += _host_blockers(core, node, demand, movable, blockers)
        if not blockers or len(blockers) > node_left.get(node, len(blockers)):
            continue
        held = sum(b.request.device.gpus if b.request.device else 0 for b in blockers)
        options.append((len(blockers), held, node, blockers))
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    return [o[3] for o in options]


def _gpu_blockers(gpus: Sequence[GPUView], demand: Demand, movable: Mapping[PodUID, Candidate]) -> list[Candidate] | None:
    """The movable pods to clear from the `demand.gpus` GPUs cheapest to clear; None when too few can be."""
    costs: list[tuple[int, int, int, list[Candidate]]] = []
    for column, gpu in enumerate(gpus):
        device = gpu.device
        if not device.healthy or device.mig_enabled or gpu.held_externally:
            continue
        if demand.model_use and device.model_label not in demand.model_use:
            continue
        free_core = FULL_PERCENT - gpu.allocated_core_percent
        free_mem = device.memory_bytes - gpu.allocated_memory_bytes
        need_core, need_mem = demand.core_need(), demand.memory_need_on(device.memory_bytes)
        clear: list[Candidate] = []
        for share in sorted(gpu.pods, key=lambda p: (-p.core_percent, p.uid)):
            if free_core >= need_core and free_mem >= need_mem:
                break
            candidate = movable.get(share.uid)
            if candidate is None:
                continue
            clear.append(candidate)
            free_core += share.core_percent
            free_mem += share.memory_bytes
        if free_core < need_core or free_mem < need_mem:
            continue
        costs.append((len(clear), gpu.allocated_core_percent, column, clear))
    if len(costs) < demand.gpus:
        return None
    chosen = sorted(costs, key=lambda c: (c[0], c[1], c[2]))[: demand.gpus]
    unique = {c.request.uid: c for _, _, _, clear in chosen for c in clear}
    return list(unique.values())


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


def _simulate(core: Scheduler, pending: PodRequest, blockers: Sequence[Candidate]) -> Plan | str:
    """Runs the moves on `core` as the cluster would, then rolls the core back."""
    originals: list[tuple[Candidate, Allocation | None]] = []
    for blocker in blockers:
        found = core.allocation_of(blocker.request.uid)
        originals.append((blocker, found[1] if found else None))
    for blocker in blockers:
        core.remove_pod(blocker.request.uid)
    placed: list[PodUID] = []
    node = blockers[0].node
    try:
        target = _schedule(core, pending)
        if target is None:
            return f"{node}: the pending pod still fits nowhere after moving {len(blockers)} pod(s)"
        placed.append(pending.uid)
        moves: list[Move] = []
        for blocker in blockers:
            to = _schedule(core, blocker.request)
            if to is None:
                return (
                    f"{node}: blocking pod {blocker.request.key} fits on no other node "
                    "(capacity, GPU model, node selector or affinity)"
                )
            placed.append(blocker.request.uid)
            moves.append(Move(blocker.request.uid, blocker.request.key, blocker.node, to))
        return Plan(pending=pending.uid, target=target, moves=tuple(moves))
    finally:
        for uid in placed:
            core.remove_pod(uid)
        for blocker, allocation in originals:
            core.add_pod(blocker.request, blocker.node, allocation)


def _schedule(core: Scheduler, request: PodRequest) -> NodeName | None:
    node = core.select(request)
    if node is None:
        return None
    try:
        core.reserve(request, node)
    except SchedulingError:
        return None
    return node
