"""Choosing pod moves that make room for one pending pod: the planner both defragmenters drive.

The churn replay (`sim/churn.py`) and the live controller (`descheduler/`) call `plan_room` with
the real core holding the cluster, the pods they may move (`Candidate`: whose owner recreates
them and that are opted in; the caller decides) and what each disruption budget still allows.
It only *chooses*: acting (evicting, rate limits, dry-run) belongs to the caller's evictor.

How it chooses (greedy, bounded):
  1. `defrag_choice.blocker_sets`: per node that could host the pending pod (the core's filter does
     not call its reason unresolvable), the movable pods whose leaving frees enough GPU share on the
     GPUs cheapest to clear, two ways (fewest pods; pods easiest to place again), plus, when the
     node is short of CPU or host memory, the movable pods that give most of it back.
  2. Those sets ranked by how many pods must move; the first `max_tries` that fit the move budget
     and the disruption budgets are *simulated* on the core, in the order the cluster would run
     them: the blockers leave, the pending pod is scheduled (kube-scheduler takes the older,
     pending pod before the recreated ones), then each recreated blocker is scheduled, hardest to
     place first (held to some GPU models, then the largest), all with the core's own
     `select`/`reserve` (so model, node selector, affinity and the policy all apply; a blocker may
     land on another GPU of the node it left). When a blocker finds no place, the same set is
     simulated again with that blocker scheduled first (the order the moves list is the order of
     the evictions, so the cluster recreates them in it). A plan is returned only when every step
     placed its pod; the core is always rolled back to where it was.

`plan_consolidation` is the explicit consolidation mode's question to the same planner: which
moves empty `node` of GPU pods (for whole-GPU or multi-GPU pods to come). No pod is pending, so
the simulation schedules the evicted pods as the cluster would with nothing holding the node:
a plan is returned only when the policy itself puts every one of them on another node.
"""

from __future__ import annotations

import enum
import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Concatenate, ParamSpec, TypeVar

from apis.allocation import Allocation
from scheduler_plugin.core.api import NodeName, PodRequest, PodUID, SchedulingError
from scheduler_plugin.core.defrag_choice import Candidate, blocker_sets, model_held
from scheduler_plugin.core.demand import FULL_PERCENT, demand_of
from scheduler_plugin.core.scheduler import Scheduler

__all__ = [
    "DEFAULT_MAX_TRIES",
    "Candidate",
    "Move",
    "NoPlan",
    "NodeOutcome",
    "Plan",
    "Refusal",
    "plan_consolidation",
    "plan_room",
]

#: blocker sets simulated at most per plan (the ranking is cheap, a simulation is a few core calls per pod)
DEFAULT_MAX_TRIES = 6


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


class NodeOutcome(enum.Enum):
    """Why one ranked blocker set was not the plan: what the churn replay counts."""

    #: more pods than the move budget, or a disruption budget without room
    OVER_BUDGET = "over-budget"
    #: the blockers left, and the pending pod still fit nowhere
    PENDING_STILL_BLOCKED = "pending-pod-still-blocked"
    #: the pending pod fit, and a moved pod fit nowhere (in either order tried)
    MOVED_POD_FITS_NOWHERE = "moved-pod-fits-nowhere"


@dataclass(frozen=True)
class Plan:
    #: the pod room is made for; None for a consolidation
    pending: PodUID | None
    #: where the pending pod landed in the simulation (the emptied node for a consolidation)
    target: NodeName
    moves: tuple[Move, ...]
    #: one line per node simulated before this plan and rejected (for Events and `fgpuctl`)
    skipped: tuple[str, ...] = ()
    #: per blocker set ranked before this plan and not taken, why
    causes: tuple[NodeOutcome, ...] = ()


@dataclass(frozen=True)
class NoPlan:
    reason: Refusal
    #: one line per simulated node that failed, for Events and `fgpuctl`
    detail: tuple[str, ...] = ()
    #: per ranked blocker set, why it was not taken
    causes: tuple[NodeOutcome, ...] = ()



_P = ParamSpec("_P")
_R = TypeVar("_R")


def _hypothetical(fn: Callable[Concatenate[Scheduler, _P], _R]) -> Callable[Concatenate[Scheduler, _P], _R]:
    """Runs a planner inside `core.hypothetical()`: its trial placements teach the policies nothing."""

    @functools.wraps(fn)
    def run(core: Scheduler, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with core.hypothetical():
            return fn(core, *args, **kwargs)

    return run

@_hypothetical
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
    options = blocker_sets(core, pending, demand, candidates, node_moves_left or {})
    if not options:
        return NoPlan(Refusal.NO_CANDIDATE_NODE)
    allowed = dict(allowances or {})
    details: list[str] = []
    causes: list[NodeOutcome] = []
    tried = 0
    for blockers in options:
        if len(blockers) > max_moves or not _within_budgets(blockers, allowed):
            causes.append(NodeOutcome.OVER_BUDGET)
            continue
        if tried >= max_tries:
            break
        tried += 1
        outcome = _simulate(core, pending, blockers)
        if isinstance(outcome, tuple):
            causes.append(outcome[0])
            details.append(outcome[1])
            continue
        return replace(outcome, skipped=tuple(details), causes=tuple(causes))
    if not tried:
        return NoPlan(Refusal.OVER_BUDGET, causes=tuple(causes))
    return NoPlan(Refusal.SIMULATION_FAILED, tuple(details), tuple(causes))


@_hypothetical
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


def _hardest_first(candidate: Candidate) -> tuple[object, ...]:
    return (not model_held(candidate), -_gpu_share(candidate), -candidate.request.cpu_milli, candidate.request.uid)


def _simulate(core: Scheduler, pending: PodRequest, blockers: Sequence[Candidate]) -> Plan | tuple[NodeOutcome, str]:
    """Runs the moves on `core` as the cluster would, then rolls the core back; a blocker that finds
    no place is tried first in the next run, once per blocker."""
    order = sorted(blockers, key=_hardest_first)
    failed = order[0]
    for _ in range(len(order)):
        outcome = _simulate_once(core, pending, order)
        if not isinstance(outcome, Candidate):
            return outcome
        failed = outcome
        if failed is order[0]:
            break
        order = [failed, *(b for b in order if b is not failed)]
    return (
        NodeOutcome.MOVED_POD_FITS_NOWHERE,
        f"{blockers[0].node}: blocking pod {failed.request.key} fits on no other node "
        "(capacity, GPU model, node selector or affinity)",
    )


def _simulate_once(
    core: Scheduler, pending: PodRequest, blockers: Sequence[Candidate]
) -> Plan | tuple[NodeOutcome, str] | Candidate:
    """One run in the given order; the blocker that found no place, if one did not."""
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
            return (
                NodeOutcome.PENDING_STILL_BLOCKED,
                f"{node}: the pending pod still fits nowhere after moving {len(blockers)} pod(s)",
            )
        placed.append(pending.uid)
        moves: list[Move] = []
        for blocker in blockers:
            to = _schedule(core, blocker.request)
            if to is None:
                return blocker
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
