"""Defragmentation planning: a short list of pod moves that lets more pods of a pending shape fit.

On a copy of the cluster held by the real core, with the planner the live descheduler and the churn
replay drive (`core/defrag_planner.plan_room`): keep every spot where the pending pod fits already
(held by probes); then, while the move budget lasts, ask the planner for the moves that let one
more pending pod fit, and apply them as its simulation ran them (the blockers leave, a probe takes
the spot, the blockers are placed again by the core's own `select`/`reserve`, so a proposed move is
always a placement the scheduler would make, honouring the moved pod's model, node selector and
affinity, and a node short of CPU or host memory is cleared too). Disruption budgets bound the
moves; each pod moves at most once. Nothing is evicted: the result is a plan, with the
fragmentation before and after.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from scheduler_plugin.core import defrag_planner
from scheduler_plugin.core.api import NodeName, PodRequest, PodUID
from scheduler_plugin.core.defrag_planner import Candidate, NoPlan, plan_room
from scheduler_plugin.core.fragmentation import TargetWorkload
from scheduler_plugin.core.policies import DEFAULT_POLICY
from scheduler_plugin.core.policy_fgd import FragmentationTracker
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.replay import NAMESPACE, pod_request
from scheduler_plugin.sim.snapshot import Snapshot, scheduler_for
from scheduler_plugin.sim.trace import TracePod
from scheduler_plugin.sim.workload import gpu_capacity_milli, shape_of

#: how many pending pods a summary counts at most (enough to tell plans apart, bounded cost)
COUNT_LIMIT = 1000


@dataclass(frozen=True)
class Move:
    pod: str
    from_node: str
    to_node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Summary:
    #: how many pods of the pending shape could be placed now, one after another
    pending_fit: int
    free_whole_gpus: int
    #: nodes with 8 or more GPUs, all free
    free_8gpu_nodes: int
    #: FGD's fragmentation, % of GPU capacity
    frag_pct: float


@dataclass(frozen=True)
class Plan:
    pending: TracePod
    moves: tuple[Move, ...]
    #: nodes where a pending pod fits thanks to the moves
    opened: tuple[str, ...]
    before: Summary
    after: Summary
    skipped: tuple[str, ...] = ()


def planning_workload(snapshot: Snapshot, pending: TracePod) -> TargetWorkload:
    """The snapshot's pod shapes plus the pending shape, weighted as much as all of them together."""
    counts = Counter(shape_of(p.pod) for p in snapshot.pods)
    counts[shape_of(pending)] += max(1, len(snapshot.pods))
    return TargetWorkload.from_counts(counts, coverage=1.0)


def _summary(core: Scheduler, snapshot: Snapshot, pending: TracePod) -> Summary:
    state = core.state
    slots = state.active_slots()
    whole = state.gpu_usable[slots] & (state.core_free[slots] == state.core_total[slots]) & (state.core_total[slots] > 0)
    counts = state.gpu_count[slots]
    full_nodes = int(((whole.sum(axis=1) == counts) & (counts >= 8)).sum())
    tracker = FragmentationTracker(state, planning_workload(snapshot, pending))
    tracker.refresh()
    capacity = gpu_capacity_milli(snapshot.nodes) or 1
    placed: list[PodUID] = []
    for i in range(COUNT_LIMIT):
        probe = replace(pending, name=f"{pending.name}-probe-{i}")
        request = pod_request(probe)
        node = core.select(request)
        if node is None:
            break
        core.reserve(request, node)
        placed.append(request.uid)
    for uid in placed:
        core.unreserve(uid)
    return Summary(
        pending_fit=len(placed),
        free_whole_gpus=int(whole.sum()),
        free_8gpu_nodes=full_nodes,
        frag_pct=round(tracker.index.total() / capacity * 100, 3),
    )


def _named(line: str) -> str:
    """A planner line with the snapshot's pod names (the core knows them as `trace/<name>`)."""
    return line.replace(f" {NAMESPACE}/", " ")


class _Planner:
    """Opens spots for the pending shape one at a time, each spot a `plan_room` plan applied to the core."""

    def __init__(self, snapshot: Snapshot, pending: TracePod, *, policy: str, max_moves: int) -> None:
        self.snapshot = snapshot
        self.pending = pending
        self.max_moves = max_moves
        self.core = scheduler_for(snapshot, policy=policy, workload=planning_workload(snapshot, pending))
        self.placed = {PodUID(p.pod.name): p for p in snapshot.pods}
        self.where = {uid: NodeName(p.node) for uid, p in self.placed.items()}
        self.moved: set[PodUID] = set()
        self.budget_used: Counter[str] = Counter()
        self.holds: list[PodUID] = []
        self.moves: list[Move] = []
        self.opened: list[str] = []
        self.skipped: list[str] = []

    def _probe(self) -> PodRequest:
        return pod_request(replace(self.pending, name=f"{self.pending.name}-hold-{len(self.holds)}"))

    def _hold(self, request: PodRequest, node: NodeName | None) -> bool:
        target = node or self.core.select(request)
        if target is None:
            return False
        self.core.reserve(request, target)
        self.holds.append(request.uid)
        return True

    def _candidates(self) -> dict[PodUID, Candidate]:
        """Every pod not moved yet, with the budgets covering it (each pod moves at most once)."""
        result = {}
        for uid, placed in self.placed.items():
            if uid in self.moved:
                continue
            budgets = tuple(b.name for b in self.snapshot.budgets if b.covers(placed))
            result[uid] = Candidate(request=placed.request(), node=self.where[uid], budgets=budgets)
        return result

    def _apply(self, plan: defrag_planner.Plan, probe: PodRequest) -> None:
        """The plan as the simulation ran it: the blockers leave, the probe is held, the blockers land."""
        for move in plan.moves:
            self.core.remove_pod(move.uid)
        self._hold(probe, plan.target)
        for move in plan.moves:
            placed = self.placed[move.uid]
            allocation = self.core.reserve(placed.request(), move.to_node)
            self.core.confirm(move.uid)
            self.where[move.uid] = move.to_node
            self.moved.add(move.uid)
            for budget in self.snapshot.budgets:
                if budget.covers(placed):
                    self.budget_used[budget.name] += 1
            self.moves.append(Move(placed.pod.name, move.from_node, move.to_node, tuple(s.minor for s in allocation.gpus)))
        self.opened.append(plan.target)

    def run(self) -> tuple[list[Move], list[str], list[str]]:
        while len(self.holds) < COUNT_LIMIT and self._hold(self._probe(), None):  # spots that need no move
            pass
        limits = {b.name: b.max_unavailable for b in self.snapshot.budgets}
        while len(self.moves) < self.max_moves:
            probe = self._probe()
            allowances = {name: limit - self.budget_used[name] for name, limit in limits.items()}
            outcome = plan_room(
                self.core, probe, self._candidates(), max_moves=self.max_moves - len(self.moves), allowances=allowances
            )
            if isinstance(outcome, NoPlan):
                self.skipped.extend(_named(line) for line in outcome.detail or (f"no more room: {outcome.reason.value}",))
                break
            self.skipped.extend(_named(line) for line in outcome.skipped)
            self._apply(outcome, probe)
        for uid in self.holds:
            self.core.unreserve(uid)
        return self.moves, self.opened, self.skipped


def plan_defrag(snapshot: Snapshot, *, pending: TracePod, max_moves: int = 10, policy: str = DEFAULT_POLICY) -> Plan:
    """The plan for `pending` (a pod shape; its name only labels probes). See the module docstring."""
    if max_moves < 0:
        raise ValueError(f"max_moves = {max_moves}; give 0 or more")
    before = _summary(
        scheduler_for(snapshot, policy=policy, workload=planning_workload(snapshot, pending)), snapshot, pending
    )
    planner = _Planner(snapshot, pending, policy=policy, max_moves=max_moves)
    moves, opened, skipped = planner.run()
    after = _summary(planner.core, snapshot, pending)
    return Plan(
        pending=pending, moves=tuple(moves), opened=tuple(opened), before=before, after=after, skipped=tuple(skipped)
    )


def moved_snapshot(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot with the plan's moves applied."""
    moved = {m.pod: m for m in plan.moves}
    pods = tuple(
        replace(p, node=moved[p.pod.name].to_node, gpus=moved[p.pod.name].gpus) if p.pod.name in moved else p
        for p in snapshot.pods
    )
    return replace(snapshot, pods=pods)

