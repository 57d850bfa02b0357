"""Defragmentation planning: a short list of pod moves that lets more pods of a pending shape fit.

Greedy, on a copy of the cluster held by the real core: keep every spot where the pending pod fits
already; then, while the move budget lasts, pick the node where the fewest pods stand in the way of
one more pending pod (on the GPUs cheapest to clear, plus, when the node is short of CPU or host
memory for the pending shape, the pods that give back most of the shortfall, CPU-only pods
included), move those pods elsewhere through the core's own `select`/`reserve` (so a proposed move
is always a placement the scheduler would make, honouring the moved pod's model, node selector and
affinity), check that the pending pod now fits there, and keep that spot. A node whose blockers
cannot all be placed elsewhere, or whose pods a disruption budget protects, is rolled back and
skipped. Each pod moves at most once. Nothing is evicted: the result is a plan, with the
fragmentation before and after.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from scheduler_plugin.core.api import NodeName, PodUID
from scheduler_plugin.core.fragmentation import TargetWorkload
from scheduler_plugin.core.policies import DEFAULT_POLICY
from scheduler_plugin.core.policy_fgd import FragmentationTracker
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.replay import pod_request
from scheduler_plugin.sim.snapshot import PlacedPod, Snapshot, allocation_for, scheduler_for
from scheduler_plugin.sim.trace import MIB, MILLI_PER_GPU, TracePod
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


def _gain(pod: TracePod, *, cpu_short: int, mem_short: int) -> float:
    """The share of a node's CPU and host-memory shortfall that `pod` gives back by leaving (0..2)."""
    cpu = min(pod.cpu_milli, cpu_short) / cpu_short if cpu_short > 0 else 0.0
    mem = min(pod.memory_mib * MIB, mem_short) / mem_short if mem_short > 0 else 0.0
    return cpu + mem


class _Planner:
    def __init__(self, snapshot: Snapshot, pending: TracePod, *, policy: str, max_moves: int) -> None:
        self.snapshot = snapshot
        self.pending = pending
        self.max_moves = max_moves
        self.core = scheduler_for(snapshot, policy=policy, workload=planning_workload(snapshot, pending))
        self.by_node: dict[str, dict[str, PlacedPod]] = {n.name: {} for n in snapshot.nodes}
        for placed in snapshot.pods:
            self.by_node[placed.node][placed.pod.name] = placed
        self.moved: set[str] = set()
        self.budget_used: Counter[str] = Counter()
        self.holds: list[PodUID] = []
        self.moves: list[Move] = []
        self.opened: list[str] = []
        self.skipped: list[str] = []
        self.nodes = {n.name: n for n in snapshot.nodes}

    def _hold(self, node: str | None) -> bool:
        probe = replace(self.pending, name=f"{self.pending.name}-hold-{len(self.holds)}")
        request = pod_request(probe)
        target = self.core.select(request, [NodeName(node)] if node else None)
        if target is None:
            return False
        self.core.reserve(request, target)
        self.holds.append(request.uid)
        return True

    def _budgets_of(self, placed: PlacedPod) -> list[str]:
        return [b.name for b in self.snapshot.budgets if b.covers(placed)]

    def _movable(self, pods: Iterable[PlacedPod]) -> bool:
        """Whether all of `pods` may move together: none moved yet, and every budget has room for them."""
        wanted: Counter[str] = Counter()
        for placed in pods:
            if placed.pod.name in self.moved:
                return False
            wanted.update(self._budgets_of(placed))
        limits = {b.name: b.max_unavailable for b in self.snapshot.budgets}
        return all(self.budget_used[name] + count <= limits[name] for name, count in wanted.items())

    def _blockers(self, node: str) -> list[PlacedPod] | None:
        """The fewest pods whose leaving lets one pending pod onto `node`; None when it can't work."""
        info = self.nodes[node]
        pending = self.pending
        if pending.num_gpu == 0 or info.gpus < pending.num_gpu or (pending.gpu_spec and info.model not in pending.gpu_spec):
            return None
        gpu_blockers = self._gpu_blockers(node)
        if gpu_blockers is None or not self._movable(gpu_blockers):
            return None
        host_blockers = self._host_blockers(node, gpu_blockers)
        if host_blockers is None:
            return None
        blockers = gpu_blockers + host_blockers
        return blockers or None

    def _gpu_blockers(self, node: str) -> list[PlacedPod] | None:
        """The pods to clear from the GPUs cheapest to clear for one pending pod; None when too few GPUs can be."""
        info = self.nodes[node]
        pending = self.pending
        per_gpu: list[list[PlacedPod]] = [[] for _ in range(info.gpus)]
        used = [0] * info.gpus
        for placed in self.by_node[node].values():
            for g in placed.gpus:
                per_gpu[g].append(placed)
                used[g] += placed.pod.gpu_milli
        need = pending.gpu_milli if pending.gpu_milli < MILLI_PER_GPU else MILLI_PER_GPU
        # Per GPU: the pods to clear so `need` is free there, largest first.
        costs: list[tuple[int, int, int, list[PlacedPod]]] = []
        unusable = set(self.snapshot.unusable_gpus.get(node, ()))
        for g in range(info.gpus):
            if g in unusable:
                continue
            free = MILLI_PER_GPU - used[g]
            clear: list[PlacedPod] = []
            for placed in sorted(per_gpu[g], key=lambda p: -p.pod.gpu_milli):
                if free >= need:
                    break
                clear.append(placed)
                free += placed.pod.gpu_milli
            if free < need or self._held(node, g):
                continue
            costs.append((len(clear), used[g], g, clear))
        if len(costs) < pending.num_gpu:
            return None
        chosen = sorted(costs)[: pending.num_gpu]
        blockers = {p.pod.name: p for _, _, _, clear in chosen for p in clear}
        return list(blockers.values())

    def _host_blockers(self, node: str, leaving: Sequence[PlacedPod]) -> list[PlacedPod] | None:
        """More pods to move when `node` is short of CPU or host memory once `leaving` left; None when none can cover it.

        Greedy: each step takes the movable pod that gives back the largest share of what is still
        short (CPU and memory shares added), preferring pods with less GPU, so CPU-only pods go first.
        """
        state = self.core.state
        slot = state.slot_of[node]
        cpu_short = mem_short = 0
        if state.cpu_alloc[slot] > 0:  # 0: not tracked, never short
            cpu_short = self.pending.cpu_milli - int(state.cpu_free[slot]) - sum(p.pod.cpu_milli for p in leaving)
        if state.host_mem_alloc[slot] > 0:
            mem_short = (
                self.pending.memory_mib * MIB - int(state.host_mem_free[slot]) - sum(p.pod.memory_mib * MIB for p in leaving)
            )
        gone = {p.pod.name for p in leaving}
        candidates = [p for p in self.by_node[node].values() if p.pod.name not in gone]
        chosen: list[PlacedPod] = []
        while cpu_short > 0 or mem_short > 0:
            gains = {p.pod.name: _gain(p.pod, cpu_short=cpu_short, mem_short=mem_short) for p in candidates}
            usable = [p for p in candidates if gains[p.pod.name] > 0 and self._movable([*leaving, *chosen, p])]
            if not usable:
                return None
            best = min(usable, key=lambda p: (-gains[p.pod.name], p.pod.total_gpu_milli, p.pod.name))
            candidates.remove(best)
            chosen.append(best)
            cpu_short -= best.pod.cpu_milli
            mem_short -= best.pod.memory_mib * MIB
        return chosen

    def _held(self, node: str, gpu: int) -> bool:
        for uid in self.holds:
            found = self.core.allocation_of(uid)
            if found and found[0] == node and any(s.minor == gpu for s in found[1].gpus):
                return True
        return False

    def _evacuate(self, node: str, blockers: Sequence[PlacedPod]) -> list[Move] | str:
        """The moves that clear `node` for one pending pod (held there), or why it could not be done (rolled back)."""
        others = [NodeName(n) for n in self.nodes if n != node]
        for placed in blockers:
            self.core.remove_pod(PodUID(placed.pod.name))
        moves: list[Move] = []
        for placed in blockers:
            request = placed.request()
            target = self.core.select(request, others)
            if target is None:
                self._undo(moves, blockers)
                return (
                    f"{node}: blocking pod {placed.pod.name} fits on no other node "
                    "(capacity, GPU model, node selector or affinity)"
                )
            allocation = self.core.reserve(request, target)
            self.core.confirm(request.uid)
            moves.append(Move(placed.pod.name, node, str(target), tuple(s.minor for s in allocation.gpus)))
        if not self._hold(node):
            self._undo(moves, blockers)
            return f"{node}: the pending pod still does not fit after moving its {len(blockers)} blocking pod(s)"
        return moves

    def _undo(self, moves: Sequence[Move], blockers: Sequence[PlacedPod]) -> None:
        for move in moves:
            self.core.remove_pod(PodUID(move.pod))
        for placed in blockers:
            self.core.add_pod(
                placed.request(), NodeName(placed.node), allocation_for(placed.pod, placed.node, placed.gpus)
            )

    def run(self) -> tuple[list[Move], list[str], list[str]]:
        while self._hold(None):  # spots that need no move
            if len(self.holds) >= COUNT_LIMIT:
                break
        tried: set[str] = set()
        while len(self.moves) < self.max_moves:
            options = []
            for node in sorted(self.nodes):
                if node in tried:
                    continue
                blockers = self._blockers(node)
                if blockers is not None and len(self.moves) + len(blockers) <= self.max_moves:
                    options.append((len(blockers), node, blockers))
            if not options:
                break
            _, node, blockers = min(options, key=lambda o: (o[0], o[1]))
            tried.add(node)
            moves = self._evacuate(node, blockers)
            if isinstance(moves, str):
                self.skipped.append(moves)
                continue
            for placed, move in zip(blockers, moves, strict=True):
                del self.by_node[placed.node][placed.pod.name]
                self.by_node[move.to_node][placed.pod.name] = replace(placed, node=move.to_node, gpus=move.gpus)
                self.moved.add(placed.pod.name)
                for name in self._budgets_of(placed):
                    self.budget_used[name] += 1
            self.moves.extend(moves)
            self.opened.append(node)
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

