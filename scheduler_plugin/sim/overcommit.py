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
from dataclasses import dataclass, field

GiB = 1.0


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
    request: float = 0.0
    limit: float = 0.0
    burstable: bool = False
    gpu: int = -1

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
    pods: list[_Pod] = []
    t = 0.0
    while True:
        t += rng.expovariate(s.arrivals_per_hour / 60)
        if t >= total_min:
            return pods
        arrive = int(t)
        leave = arrive + max(1, int(rng.expovariate(1 / (s.mean_life_h * 60))))
        starts = tuple(m for m in range(arrive, min(leave, total_min)) if rng.random() < u.burst_per_min)
        pods.append(_Pod(nominal=rng.choice(s.sizes_gib), base=rng.betavariate(a, b),
                         eligible=rng.random() < s.burstable_fraction, arrive_min=arrive, leave_min=leave,
                         burst_starts=starts))


def _run(s: OvercommitScenario, ratio: float | None) -> tuple[int, int]:
    """(pods placed, evictions) with overcommit at `ratio`, or without it (None)."""
    pods = [_Pod(p.nominal, p.base, p.eligible, p.arrive_min, p.leave_min, p.burst_starts) for p in _pods(s)]
    guaranteed = [0.0] * s.gpus
    requested = [0.0] * s.gpus
    burst_limits = [0.0] * s.gpus
    on_gpu: list[list[_Pod]] = [[] for _ in range(s.gpus)]
    by_arrival: dict[int, list[_Pod]] = {}
    for p in pods:
        by_arrival.setdefault(p.arrive_min, []).append(p)
    placed = evictions = 0
    cap = s.gpu_gib

    def remove(p: _Pod) -> None:
        g = p.gpu
        on_gpu[g].remove(p)
        requested[g] -= p.request
        if p.burstable:
            burst_limits[g] -= p.limit
        else:
            guaranteed[g] -= p.request
        p.gpu = -1

    for minute in range(int(s.hours * 60)):
        for g in range(s.gpus):
            for p in [p for p in on_gpu[g] if p.leave_min <= minute]:
                remove(p)
        for p in by_arrival.get(minute, ()):
            p.burstable = ratio is not None and p.eligible
            p.request = math.ceil(p.nominal * s.usage.usage_mean) if p.burstable else p.nominal
            p.limit = p.nominal
            for g in range(s.gpus):
                if requested[g] + p.request > cap + 1e-9:
                    continue
                if p.burstable and ratio is not None and burst_limits[g] + p.limit > ratio * (cap - guaranteed[g]) + 1e-9:
                    continue
                p.gpu = g
                on_gpu[g].append(p)
                requested[g] += p.request
                if p.burstable:
                    burst_limits[g] += p.limit
                else:
                    guaranteed[g] += p.request
                placed += 1
                break
        for g in range(s.gpus):
            if not on_gpu[g]:
                continue
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
