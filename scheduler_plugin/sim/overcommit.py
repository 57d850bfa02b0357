"""What burstable overcommit buys and costs: extra pods placed versus evictions per hour, simulated.

The openb trace has requests but no usage, so usage is a model, and a parameter (docs/overcommit.md,
"Simulation"):

* pods arrive (Poisson, `arrivals_per_hour`) and leave (exponential lifetimes, `mean_life_h`), each
  asking one card's share of memory drawn from `sizes_gib`; a fraction `burstable_fraction` are
  inference pods that may be burstable;
* a pod's steady usage is its nominal size times a Beta draw of mean `usage_mean` (concentration 8);
  each minute it starts a burst with probability `burst_per_min`, using its whole nominal size
  for `burst_min` minutes;
* without overcommit every pod reserves its nominal size (guaranteed). With ratio R, a burstable pod
  reserves `usage_mean` x nominal (its request) with the nominal size as its limit, placed under the
  scheduler's rule (core/overcommit.py): sum of burstable limits <= R x what guaranteed requests
  leave; a guaranteed pod counts requests only;
* every minute, a GPU whose usage passes `high_water` evicts burstable pods, largest overuse first,
  as the node's reclaim does (agent/reclaim.py; priorities are equal here); a guaranteed pod that
  wants more than its request is clipped to it (the isolation backend's cap).

Placement is first fit over the GPUs; a pod that fits nowhere is refused (no queue), so "placed"
counts admissions. The same seed gives the same arrivals, sizes and draws to both runs.
Pure and seeded; memory only (compute is not reclaimed, docs/overcommit.md says why).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler_plugin.sim.churn import TimedPod
from scheduler_plugin.sim.trace import MILLI_PER_GPU, TraceNode

GiB = 1.0


@dataclass(frozen=True)
class Arrival:
    """A pod of a replayed trace: when it comes and goes, and what it asks."""

    arrive_min: int
    leave_min: int
    #: the memory it would reserve as a guaranteed share (GiB); whole cards: `cards` x the card
    nominal_gib: float
    #: whole cards on one node (0: a share of one card, the only kind that may be burstable)
    cards: int = 0


@dataclass(frozen=True)
class UsageModel:
    usage_mean: float = 0.5
    burst_per_min: float = 0.002
    burst_min: int = 10
    concentration: float = 8.0


@dataclass(frozen=True)
class OvercommitScenario:
    gpus: int = 64
    gpu_gib: float = 80.0
    hours: float = 24.0
    arrivals_per_hour: float = 120.0
    mean_life_h: float = 2.0
    sizes_gib: tuple[float, ...] = (8.0, 16.0, 24.0, 40.0)
    burstable_fraction: float = 0.6
    high_water: float = 0.95
    usage: UsageModel = field(default_factory=UsageModel)
    seed: int = 1
    #: a replayed trace's pods (`trace_scenario`); empty: the synthetic arrivals above
    arrivals: tuple[Arrival, ...] = ()
    #: GPUs per node; empty: `gpus` nodes of one GPU
    node_gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class OvercommitResult:
    ratio: float
    usage_mean: float
    placed_without: int
    placed_with: int
    evictions: int
    hours: float

    @property
    def extra_pods_placed(self) -> int:
        return self.placed_with - self.placed_without

    @property
    def evictions_per_hour(self) -> float:
        return self.evictions / self.hours

    def to_json(self) -> dict[str, float | int]:
        return {
            "ratio": self.ratio, "usage_mean": self.usage_mean, "placed_without": self.placed_without,
            "placed_with": self.placed_with, "extra_pods_placed": self.extra_pods_placed,
            "evictions": self.evictions, "evictions_per_hour": round(self.evictions_per_hour, 3),
        }


@dataclass
class _Pod:
    nominal: float
    base: float
    eligible: bool
    arrive_min: int
    leave_min: int
    burst_starts: tuple[int, ...]
    cards: int = 0
    request: float = 0.0
    limit: float = 0.0
    burstable: bool = False
    gpus: list[int] = field(default_factory=list)

    def usage(self, minute: int, burst_min: int) -> float:
        bursting = any(s <= minute < s + burst_min for s in self.burst_starts)
        want = self.nominal if bursting else self.nominal * self.base
        return min(want, self.limit)


def _pods(s: OvercommitScenario) -> list[_Pod]:
    rng = random.Random(s.seed)
    total_min = int(s.hours * 60)
    u = s.usage
    a = max(u.usage_mean * u.concentration, 1e-3)
    b = max((1 - u.usage_mean) * u.concentration, 1e-3)

    def pod(arrive: int, leave: int, nominal: float, cards: int) -> _Pod:
        starts = tuple(m for m in range(arrive, min(leave, total_min)) if rng.random() < u.burst_per_min)
        eligible = rng.random() < s.burstable_fraction and cards == 0
        return _Pod(nominal=nominal, base=rng.betavariate(a, b), eligible=eligible, arrive_min=arrive,
                    leave_min=leave, burst_starts=starts, cards=cards)

    if s.arrivals:
        return [pod(x.arrive_min, x.leave_min, x.nominal_gib, x.cards) for x in s.arrivals]
    pods: list[_Pod] = []
    t = 0.0
    while True:
        t += rng.expovariate(s.arrivals_per_hour / 60)
        if t >= total_min:
            return pods
        arrive = int(t)
        leave = arrive + max(1, int(rng.expovariate(1 / (s.mean_life_h * 60))))
        pods.append(pod(arrive, leave, rng.choice(s.sizes_gib), 0))


def _run(s: OvercommitScenario, ratio: float | None) -> tuple[int, int]:
    """(pods placed, evictions) with overcommit at `ratio`, or without it (None)."""
    pods = _pods(s)
    node_gpus = s.node_gpus or (1,) * s.gpus
    gpu_count = sum(node_gpus)
    nodes: list[range] = []
    first = 0
    for count in node_gpus:
        nodes.append(range(first, first + count))
        first += count
    guaranteed = [0.0] * gpu_count
    requested = [0.0] * gpu_count
    burst_limits = [0.0] * gpu_count
    on_gpu: list[list[_Pod]] = [[] for _ in range(gpu_count)]
    by_arrival: dict[int, list[_Pod]] = {}
    by_departure: dict[int, list[_Pod]] = {}
    for p in pods:
        by_arrival.setdefault(p.arrive_min, []).append(p)
    placed = evictions = 0
    cap = s.gpu_gib
    busy: set[int] = set()  # GPUs holding a share (whole cards hold no burstable pod: nothing to check)

    def remove(p: _Pod) -> None:
        for g in p.gpus:
            if p.cards:
                requested[g] = guaranteed[g] = 0.0
                continue
            on_gpu[g].remove(p)
            if not on_gpu[g]:
                busy.discard(g)
            requested[g] -= p.request
            if p.burstable:
                burst_limits[g] -= p.limit
            else:
                guaranteed[g] -= p.request
        p.gpus = []

    def place_share(p: _Pod) -> bool:
        for g in range(gpu_count):
            if requested[g] + p.request > cap + 1e-9:
                continue
            if p.burstable and ratio is not None and burst_limits[g] + p.limit > ratio * (cap - guaranteed[g]) + 1e-9:
                continue
            p.gpus = [g]
            on_gpu[g].append(p)
            busy.add(g)
            requested[g] += p.request
            if p.burstable:
                burst_limits[g] += p.limit
            else:
                guaranteed[g] += p.request
            return True
        return False

    def place_cards(p: _Pod) -> bool:
        for gpus in nodes:
            free = [g for g in gpus if requested[g] == 0]
            if len(free) >= p.cards:
                p.gpus = free[: p.cards]
                for g in p.gpus:
                    requested[g] = guaranteed[g] = cap
                return True
        return False

    for minute in range(int(s.hours * 60)):
        for p in by_departure.pop(minute, ()):
            if p.gpus:
                remove(p)
        for p in by_arrival.get(minute, ()):
            p.burstable = ratio is not None and p.eligible
            p.request = math.ceil(p.nominal * s.usage.usage_mean) if p.burstable else p.nominal
            p.limit = p.nominal
            if place_cards(p) if p.cards else place_share(p):
                placed += 1
                by_departure.setdefault(max(p.leave_min, minute + 1), []).append(p)
        for g in sorted(busy):
            used = {id(p): p.usage(minute, s.usage.burst_min) if p.burstable else
                    min(p.usage(minute, s.usage.burst_min), p.request) for p in on_gpu[g]}
            total = sum(used.values())
            mark = s.high_water * cap
            if total <= mark:
                continue
            for p in sorted((p for p in on_gpu[g] if p.burstable), key=lambda p: used[id(p)] - p.request, reverse=True):
                if total <= mark:
                    break
                total -= used[id(p)]
                remove(p)
                evictions += 1
    return placed, evictions


def trace_scenario(
    nodes: Sequence[TraceNode], pods: Sequence[TimedPod], *, usage: UsageModel, seed: int, gpu_gib: float = 80.0,
    burstable_fraction: float = 0.6, high_water: float = 0.95,
) -> OvercommitScenario:
    """The churn replay's cluster and pods (`sim/churn.py`: its nodes, arrivals and lifetimes) for the model.

    Cards are taken as one size, `gpu_gib`: a share's nominal memory is its `gpu_milli` part of a card,
    and a pod of whole cards (`gpu_milli` 1000, or several cards) takes that many fully free cards of one
    node. Pods without GPUs are left out. The run covers the arrival span.
    """
    arrivals = []
    for timed in pods:
        pod = timed.pod
        if pod.num_gpu < 1 or pod.gpu_milli < 1:
            continue
        arrive = int(timed.arrive // 60)
        leave = arrive + max(1, int(timed.lifetime // 60))
        whole = pod.num_gpu > 1 or pod.gpu_milli >= MILLI_PER_GPU
        cards = pod.num_gpu if whole else 0
        nominal = cards * gpu_gib if whole else gpu_gib * pod.gpu_milli / MILLI_PER_GPU
        arrivals.append(Arrival(arrive_min=arrive, leave_min=leave, nominal_gib=nominal, cards=cards))
    if not arrivals:
        raise ValueError("the trace has no GPU pods to replay")
    hours = (max(a.arrive_min for a in arrivals) + 1) / 60
    return OvercommitScenario(
        gpus=sum(n.gpus for n in nodes), gpu_gib=gpu_gib, hours=hours, burstable_fraction=burstable_fraction,
        high_water=high_water, usage=usage, seed=seed, arrivals=tuple(arrivals),
        node_gpus=tuple(n.gpus for n in nodes if n.gpus > 0),
    )


def simulate(scenario: OvercommitScenario, *, ratio: float) -> OvercommitResult:
    """Both runs over the same seeded arrivals: without overcommit, and with it at `ratio`."""
    if ratio < 1:
        raise ValueError(f"--overcommit {ratio}: the ratio must be at least 1 (1 = limits within what guaranteed shares leave)")
    if not 0 < scenario.usage.usage_mean <= 1:
        raise ValueError(f"--usage-mean {scenario.usage.usage_mean}: must be a fraction of the request in (0, 1], e.g. 0.5")
    placed_without, _ = _run(scenario, None)
    placed_with, evictions = _run(scenario, ratio)
    return OvercommitResult(ratio=ratio, usage_mean=scenario.usage.usage_mean, placed_without=placed_without,
                            placed_with=placed_with, evictions=evictions, hours=scenario.hours)
