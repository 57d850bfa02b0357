"""Churn replay: the trace with time, pods arriving and leaving, through the real scheduler core.

A pod arrives at `creation_time / load_factor` (compressing inter-arrival times by the load factor
raises the offered load; lifetimes are kept) and, once placed, runs `deletion_time -
creation_time` seconds. Every placement is the core's `select` + `reserve` + `confirm` with the
chosen policy, as in `replay.py`. Queueing follows kube-scheduler: a new pod is tried at once; one
that fits nowhere waits in the unschedulable queue, and every departure retries the waiting pods
in arrival order (FIFO). Only the departed pod's node changed since their last try, so a retry
asks about that node; placing a pod only takes capacity, so that is exact. A pod that would not
fit even the empty cluster is counted as `never_fit` and not queued.

With `defrag_per_100` set, the defragmenter runs every `defrag_period_s` of simulated time: for
waiting GPU pods (FIFO) that waited at least `defrag_wait_s` and would fit the cluster's free GPU
capacity of their models had it not been fragmented, it asks `core/defrag_planner.plan_room` (the
live controller's planner) for moves within the move budget (`defrag_per_100` moves per 100
arrivals so far) and applies them as the cluster would: the blockers leave, the pending pod is
scheduled, the blockers' recreated copies are scheduled. Each plan asked for is counted by its
outcome (`plan_outcomes`: per attempt, planned or the planner's refusal; per blocker set the planner
ranked and did not take, why).

A move costs the moved pod a restart: its copy starts `move_restart_s` (300 s) after the eviction
(pull, start, warm-up: the GPUs it holds do no work meanwhile) and then runs the rest of its lifetime,
so it leaves `move_restart_s` later than it would have. With `moved_pods_lose_progress` it runs its
whole lifetime again (a batch job that keeps no checkpoint: the worst case). What a move cost (GPU
share x the restart, plus the lost progress) is `move_cost_gpu_hours`, kept apart from the pending
GPU-hours so that the GPU-hours a move recovers can be given net of it. A pod moves at most once.

Measured over time (`Sample`s) and in total: GPU allocation (time-weighted over the arrival span),
FGD's fragmentation, GPU pods waiting, their waiting time, pending GPU-hours, and the part of them
spent while the pod would have fit the free GPU capacity (per allowed model, walking the queue in
FIFO order and taking each fitting pod's request out of it) had that capacity not been fragmented.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scheduler_plugin.core.api import NodeName, PodRequest
from scheduler_plugin.core.defrag_planner import Candidate, Move, NoPlan, plan_room
from scheduler_plugin.core.policy_fgd import FragmentationTracker
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.replay import build_scheduler, pod_request
from scheduler_plugin.sim.trace import MILLI_PER_GPU, TraceError, TraceNode, TracePod, csv_rows
from scheduler_plugin.sim.workload import gpu_capacity_milli, shape_of, typical_shapes

HOUR = 3600.0
SAMPLES = 200
_DEPART, _ARRIVE = 0, 1


@dataclass(frozen=True)
class TimedPod:
    pod: TracePod
    arrive: float
    #: seconds it runs once placed
    lifetime: float


@dataclass(frozen=True)
class Sample:
    hours: float
    alloc_pct: float
    frag_pct: float
    waiting_gpu_pods: int
    #: of them, how many would fit the free capacity were it not fragmented
    blocked_by_fragmentation: int


@dataclass(frozen=True)
class ChurnResult:
    policy: str
    seed: int
    load_factor: float
    defrag_per_100: float | None
    arrivals: int
    gpu_arrivals: int
    never_fit: int
    gpu_pods_waited: int
    pending_gpu_hours: float
    fragmented_pending_gpu_hours: float
    mean_wait_h: float
    p95_wait_h: float
    max_wait_h: float
    mean_allocation: float
    mean_frag: float
    moves: int
    plans: int
    aborted: Mapping[str, int]
    #: "attempts": plan requests by outcome ("planned" or the refusal); "blocker_sets": sets ranked and not taken, by why
    plan_outcomes: Mapping[str, Mapping[str, int]]
    #: GPU-hours moved pods spent again: the restart, plus the lost progress when that is modelled
    move_cost_gpu_hours: float
    samples: tuple[Sample, ...]
    seconds: float
    horizon_h: float

    @property
    def moves_per_100_arrivals(self) -> float:
        return 100.0 * self.moves / self.arrivals if self.arrivals else 0.0


@dataclass(frozen=True)
class ChurnSettings:
    policy: str = "fgpu"
    seed: int = 42
    load_factor: float = 1.0
    #: moves allowed per 100 arrivals; None = no defragmentation
    defrag_per_100: float | None = None
    defrag_period_s: float = 60.0
    defrag_wait_s: float = 300.0
    #: most pods one plan may move
    max_moves_per_plan: int = 4
    #: waiting pods planned for per defragmenter run
    plans_per_run: int = 3
    #: seconds from a move's eviction until the moved pod's copy works again
    move_restart_s: float = 300.0
    #: a moved pod runs its whole lifetime again (no checkpoint) rather than the rest of it
    moved_pods_lose_progress: bool = False
    samples: int = SAMPLES


def read_lifetimes(path: str | Path) -> dict[str, tuple[int, int]]:
    """name -> (creation_time, deletion_time) from a pod list with those columns."""
    times: dict[str, tuple[int, int]] = {}
    hint = (
        "; the churn replay needs creation_time and deletion_time "
        "(the multigpu variants lack them: use a pod list that has them)"
    )
    for line, row in csv_rows(path, ("name", "creation_time", "deletion_time"), hint=hint):
        try:
            created, deleted = int(row.get("creation_time") or ""), int(row.get("deletion_time") or "")
        except ValueError:
            raise TraceError(
                f"{path}:{line}: creation_time {row.get('creation_time')!r} / deletion_time "
                f"{row.get('deletion_time')!r} is not an integer; write seconds"
            ) from None
        if created < 0 or deleted < created:
            raise TraceError(
                f"{path}:{line}: deletion_time {deleted} < creation_time {created}; a pod leaves after it arrives"
            )
        times[(row.get("name") or "").strip()] = (created, deleted)
    return times


def scale_cluster(nodes: Sequence[TraceNode], fraction: float) -> list[TraceNode]:
    """Every (1/fraction)-th GPU node in (model, GPUs, name) order: a smaller cluster with the same mix."""
    if not 0 < fraction <= 1:
        raise ValueError(f"cluster fraction = {fraction}; give a share in (0, 1] of the GPU nodes")
    ordered = sorted((n for n in nodes if n.gpus > 0), key=lambda n: (n.model, n.gpus, n.name))
    keep = max(1, round(len(ordered) * fraction))
    return [ordered[int(i * len(ordered) / keep)] for i in range(keep)]


def timed_pods(pods: Sequence[TracePod], times: Mapping[str, tuple[int, int]], *, load_factor: float) -> list[TimedPod]:
    """The pods in arrival order (ties by name), arrivals compressed by `load_factor`."""
    if load_factor <= 0:
        raise ValueError(f"load_factor = {load_factor}; give a positive factor (1 = the trace's own pace)")
    result = []
    for pod in pods:
        if pod.name not in times:
            raise TraceError(f"pod {pod.name}: no creation/deletion time; give the pod list the times came from")
        created, deleted = times[pod.name]
        result.append(TimedPod(pod=pod, arrive=created / load_factor, lifetime=float(deleted - created)))
    result.sort(key=lambda t: (t.arrive, t.pod.name))
    return result


@dataclass
class _Waiting:
    timed: TimedPod
    request: PodRequest
    since: float


@dataclass
class _Run:
    settings: ChurnSettings
    core: Scheduler
    capacity: int
    model_of_slot: list[str]
    events: list[tuple[float, int, int, str]] = field(default_factory=list)
    waiting: dict[str, _Waiting] = field(default_factory=dict)
    running: dict[str, tuple[TimedPod, PodRequest, NodeName]] = field(default_factory=dict)
    moved: set[str] = field(default_factory=set)
    #: name -> when it leaves; a departure event at another time is stale (the pod moved)
    departs: dict[str, float] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)
    blocker_sets: Counter[str] = field(default_factory=Counter)
    move_cost_milli_s: float = 0.0
    allocated_milli: int = 0
    waits: list[tuple[float, int]] = field(default_factory=list)
    moves: int = 0
    plans: int = 0
    aborted: Counter[str] = field(default_factory=Counter)
    seq: int = 0

    def schedule_departure(self, timed: TimedPod, at: float) -> None:
        self.seq += 1
        self.departs[timed.pod.name] = at
        heapq.heappush(self.events, (at, _DEPART, self.seq, timed.pod.name))

    def started(self, timed: TimedPod, request: PodRequest, node: NodeName, now: float) -> None:
        self.running[timed.pod.name] = (timed, request, node)
        self.allocated_milli += timed.pod.total_gpu_milli
        self.schedule_departure(timed, now + timed.lifetime)

    def try_place(self, timed: TimedPod, now: float, only: NodeName | None = None) -> bool:
        request = pod_request(timed.pod)
        node = self.core.select(request, [only] if only else None)
        if node is None:
            return False
        self.core.reserve(request, node)
        self.core.confirm(request.uid)
        self.started(timed, request, node, now)
        return True

    def retry(self, now: float, node: NodeName | None) -> None:
        """FIFO retry of the waiting pods after `node` changed (None: anything may have)."""
        failed: set[tuple[object, ...]] = set()
        for name in list(self.waiting):
            entry = self.waiting[name]
            shape = (shape_of(entry.timed.pod), entry.timed.pod.memory_mib)
            if shape in failed:
                continue
            if self.try_place(entry.timed, now, node):
                del self.waiting[name]
                if entry.timed.pod.num_gpu:
                    self.waits.append((now - entry.since, entry.timed.pod.total_gpu_milli))
            else:
                failed.add(shape)

    def free_by_model(self) -> dict[str, int]:
        state = self.core.state
        free = np.where(state.gpu_usable, state.core_free, 0).sum(axis=1) * (MILLI_PER_GPU // 100)
        totals: Counter[str] = Counter()
        for slot in np.flatnonzero(free > 0).tolist():
            totals[self.model_of_slot[slot]] += int(free[slot])
        return dict(totals)

    def fragmentation_blocked(self) -> list[_Waiting]:
        """Waiting GPU pods that would fit the free capacity of their models, were it one pool (FIFO)."""
        pool = self.free_by_model()
        blocked = []
        for entry in self.waiting.values():
            pod = entry.timed.pod
            if not pod.num_gpu:
                continue
            models = [m for m in (pod.gpu_spec or tuple(pool)) if pool.get(m, 0) > 0]
            need = pod.total_gpu_milli
            if sum(pool[m] for m in models) < need:
                continue
            for model in sorted(models, key=lambda m: -pool[m]):
                take = min(need, pool[model])
                pool[model] -= take
                need -= take
                if need == 0:
                    break
            blocked.append(entry)
        return blocked

    def defragment(self, now: float, arrivals: int) -> bool:
        """One defragmenter run; True when a plan was applied."""
        settings = self.settings
        assert settings.defrag_per_100 is not None
        applied = False
        tries = 0
        for entry in self.fragmentation_blocked():
            if tries >= settings.plans_per_run:
                break
            if now - entry.since < settings.defrag_wait_s or entry.timed.pod.name not in self.waiting:
                continue
            allowance = int(settings.defrag_per_100 * arrivals / 100) - self.moves
            if allowance <= 0:
                break
            tries += 1
            candidates = {
                request.uid: Candidate(request=request, node=node)
                for name, (_, request, node) in self.running.items()
                if name not in self.moved
            }
            outcome = plan_room(
                self.core, entry.request, candidates, max_moves=min(allowance, settings.max_moves_per_plan)
            )
            self.blocker_sets.update(cause.value for cause in outcome.causes)
            if isinstance(outcome, NoPlan):
                self.aborted[outcome.reason.value] += 1
                self.attempts[outcome.reason.value] += 1
                continue
            self.attempts["planned"] += 1
            self.plans += 1
            self.apply(outcome.moves, entry, now)
            applied = True
        return applied

    def apply(self, moves: Sequence[Move], entry: _Waiting, now: float) -> None:
        """The cluster's side of a plan: blockers evicted, the pending pod scheduled, blockers recreated."""
        evicted = []
        for move in moves:
            name = str(move.uid)
            timed, request, _ = self.running.pop(name)
            self.core.remove_pod(request.uid)
            self.allocated_milli -= timed.pod.total_gpu_milli
            evicted.append((timed, request))
        name = entry.timed.pod.name
        if self.try_place(entry.timed, now):
            del self.waiting[name]
            self.waits.append((now - entry.since, entry.timed.pod.total_gpu_milli))
        else:
            self.aborted["pending-pod-did-not-fit"] += 1
        for timed, request in evicted:
            self.moved.add(timed.pod.name)
            self.moves += 1
            node = self.core.select(request)
            if node is None:  # the plan promised a place: count it, let it wait like any pod
                self.aborted["moved-pod-did-not-fit"] += 1
                self.waiting[timed.pod.name] = _Waiting(timed, request, now)
                continue
            self.core.reserve(request, node)
            self.core.confirm(request.uid)
            self.running[timed.pod.name] = (timed, request, node)
            self.allocated_milli += timed.pod.total_gpu_milli
            remaining = self.departs[timed.pod.name] - now
            lost = timed.lifetime - remaining if self.settings.moved_pods_lose_progress else 0.0
            self.schedule_departure(timed, now + self.settings.move_restart_s + remaining + lost)
            self.move_cost_milli_s += timed.pod.total_gpu_milli * (self.settings.move_restart_s + lost)


def churn_replay(*, nodes: Sequence[TraceNode], pods: Sequence[TimedPod], settings: ChurnSettings) -> ChurnResult:
    """One churn run; see the module docstring."""
    started = time.perf_counter()
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    capacity = gpu_capacity_milli(gpu_nodes)
    if capacity <= 0:
        raise ValueError("the node list has no GPU; the churn replay needs at least one GPU node")
    if settings.defrag_per_100 is not None and settings.defrag_per_100 < 0:
        raise ValueError(f"defrag_per_100 = {settings.defrag_per_100}; give 0 or more moves per 100 arrivals")
    if settings.move_restart_s < 0:
        raise ValueError(f"move_restart_s = {settings.move_restart_s}; give the seconds a moved pod takes to restart (0 or more)")
    workload = typical_shapes([t.pod for t in pods])
    core = build_scheduler(gpu_nodes, policy=settings.policy, seed=settings.seed, workload=workload)
    empty = build_scheduler(gpu_nodes, policy=settings.policy, seed=settings.seed, workload=workload)
    observer = FragmentationTracker(core.state, workload)
    core.state.add_listener(observer)
    model_of_slot = [""] * core.state.capacity
    for gpu_node in gpu_nodes:
        model_of_slot[core.state.slot_of[gpu_node.name]] = gpu_node.model
    run = _Run(settings=settings, core=core, capacity=capacity, model_of_slot=model_of_slot)
    fits_empty: dict[tuple[object, ...], bool] = {}

    start = pods[0].arrive if pods else 0.0
    end = pods[-1].arrive if pods else 0.0
    step = (end - start) / max(1, settings.samples) or 1.0
    next_sample = start
    samples: list[Sample] = []
    alloc_area = frag_area = 0.0
    pending_area = fragmented_area = 0.0
    blocked_milli = 0
    blocked_count = 0
    waiting_milli = 0
    last = start
    frag_now = 0.0
    arrivals = gpu_arrivals = never_fit = 0
    next_defrag = start
    position = 0

    def measure_frag() -> float:
        observer.refresh()
        return float(observer.index.total() / capacity * 100)

    while position < len(pods) or (run.events and run.waiting):
        arrival_time = pods[position].arrive if position < len(pods) else float("inf")
        if run.events and run.events[0][0] <= arrival_time:
            now, kind, _, name = heapq.heappop(run.events)
        else:
            now, kind, name = arrival_time, _ARRIVE, pods[position].pod.name
        # Integrate the piecewise-constant measures up to `now`.
        span = now - last
        if span > 0:
            inside = max(0.0, min(now, end) - max(last, start))
            alloc_area += run.allocated_milli * inside
            frag_area += frag_now * inside
            pending_area += waiting_milli * span
            fragmented_area += blocked_milli * span
            last = now
        while next_sample <= min(now, end) and len(samples) <= settings.samples:
            waiting_gpu = sum(1 for w in run.waiting.values() if w.timed.pod.num_gpu)
            samples.append(
                Sample(
                    hours=round((next_sample - start) / HOUR, 4),
                    alloc_pct=round(run.allocated_milli / capacity * 100, 3),
                    frag_pct=round(frag_now, 3),
                    waiting_gpu_pods=waiting_gpu,
                    blocked_by_fragmentation=blocked_count,
                )
            )
            next_sample += step
        if kind == _DEPART:
            if name not in run.running or run.departs.get(name) != now:
                continue  # never ran, or moved: this departure time is stale
            timed, request, left = run.running.pop(name)
            run.core.remove_pod(request.uid)
            run.allocated_milli -= timed.pod.total_gpu_milli
            run.retry(now, left)
        else:
            timed = pods[position]
            position += 1
            arrivals += 1
            gpu_arrivals += timed.pod.num_gpu > 0
            key = (shape_of(timed.pod), timed.pod.memory_mib)
            if key not in fits_empty:
                fits_empty[key] = empty.select(pod_request(timed.pod)) is not None
            if not fits_empty[key]:
                never_fit += 1
            elif not run.try_place(timed, now):
                run.waiting[timed.pod.name] = _Waiting(timed, pod_request(timed.pod), now)
        if settings.defrag_per_100 is not None and run.waiting and now >= next_defrag:
            next_defrag = now + settings.defrag_period_s
            if run.defragment(now, arrivals):
                run.retry(now, None)
        if now <= end + step:
            frag_now = measure_frag()
        waiting_milli = sum(w.timed.pod.total_gpu_milli for w in run.waiting.values())
        blocked = run.fragmentation_blocked() if run.waiting else []
        blocked_milli = sum(w.timed.pod.total_gpu_milli for w in blocked)
        blocked_count = len(blocked)
    # Pods still waiting when nothing is left to leave: counted until the last event.
    for entry in run.waiting.values():
        if entry.timed.pod.num_gpu:
            run.waits.append((last - entry.since, entry.timed.pod.total_gpu_milli))
    waits_h = sorted(w / HOUR for w, _ in run.waits if w > 0)
    window = max(end - start, 1e-9)
    return ChurnResult(
        policy=settings.policy,
        seed=settings.seed,
        load_factor=settings.load_factor,
        defrag_per_100=settings.defrag_per_100,
        arrivals=arrivals,
        gpu_arrivals=gpu_arrivals,
        never_fit=never_fit,
        gpu_pods_waited=len(waits_h),
        pending_gpu_hours=round(pending_area / MILLI_PER_GPU / HOUR, 3),
        fragmented_pending_gpu_hours=round(fragmented_area / MILLI_PER_GPU / HOUR, 3),
        mean_wait_h=round(float(np.mean(waits_h)), 4) if waits_h else 0.0,
        p95_wait_h=round(waits_h[int(0.95 * (len(waits_h) - 1))], 4) if waits_h else 0.0,
        max_wait_h=round(waits_h[-1], 4) if waits_h else 0.0,
        mean_allocation=round(alloc_area / window / capacity * 100, 3) if end > start else 0.0,
        mean_frag=round(frag_area / window, 3) if end > start else 0.0,
        moves=run.moves,
        plans=run.plans,
        aborted=dict(run.aborted),
        plan_outcomes={"attempts": dict(run.attempts), "blocker_sets": dict(run.blocker_sets)},
        move_cost_gpu_hours=round(run.move_cost_milli_s / MILLI_PER_GPU / HOUR, 3),
        samples=tuple(samples),
        seconds=round(time.perf_counter() - started, 2),
        horizon_h=round((last - start) / HOUR, 3),
    )
