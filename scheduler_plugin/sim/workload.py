"""The replay protocol's workload steps: order, shuffle, tune to a capacity ratio, typical shapes.

Follows the trace README: sort by name, shuffle with the run's seed, then either append clones
(drawn uniformly, with replacement, from the name-sorted original) or drop random pods until the
total GPU request is about `tune` x capacity. Clones are new pods with their own names so the
core can track them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from scheduler_plugin.core.fragmentation import PodShape, TargetWorkload
from scheduler_plugin.sim.trace import MIB, MILLI_PER_GPU, TraceError, TraceNode, TracePod

#: the share of the trace's pods the typical shapes cover (FGD's target workload)
TYPICAL_COVERAGE = 0.95


@dataclass(frozen=True)
class Workload:
    """The pods of one run, in arrival order."""

    pods: tuple[TracePod, ...]
    #: how many leading pods come from the trace itself (the rest are clones)
    originals: int
    clones: int
    dropped: int


def gpu_capacity_milli(nodes: Sequence[TraceNode]) -> int:
    return sum(n.gpus for n in nodes) * MILLI_PER_GPU


def order_and_tune(
    pods: Sequence[TracePod], *, capacity_milli: int, seed: int, tune: float | None
) -> Workload:
    """Sorts by name, shuffles with `seed`, then tunes the total GPU request to `tune` x capacity."""
    rng = np.random.default_rng(seed)
    by_name = sorted(pods, key=lambda p: p.name)
    order = rng.permutation(len(by_name))
    shuffled = [by_name[int(i)] for i in order]
    if tune is None:
        return Workload(pods=tuple(shuffled), originals=len(shuffled), clones=0, dropped=0)
    target = tune * capacity_milli
    total = sum(p.total_gpu_milli for p in shuffled)
    if not total:
        # Clones would add nothing: tuning a CPU-only trace would never end.
        raise TraceError("the trace asks for no GPU; nothing to tune (replay it as is: tune None, --tune 0)")
    if total < target:
        clones: list[TracePod] = []
        taken = {p.name for p in by_name}
        while True:
            pick = by_name[int(rng.integers(len(by_name)))]
            # The reference checks the per-GPU milli, not the total: a multi-GPU clone can overshoot.
            if total + pick.gpu_milli > target:
                break
            name = f"{pick.name}-clone-{len(clones):05d}"
            while name in taken:  # the core keeps one reservation per name: a clone needs its own
                name += "-x"
            taken.add(name)
            clones.append(replace(pick, name=name))
            total += pick.total_gpu_milli
        return Workload(pods=tuple(shuffled + clones), originals=len(shuffled), clones=len(clones), dropped=0)
    keep = [True] * len(shuffled)
    dropped = 0
    while total > target:
        index = int(rng.integers(len(shuffled)))
        if not keep[index]:
            continue
        keep[index] = False
        dropped += 1
        total -= shuffled[index].total_gpu_milli
    kept = tuple(p for p, k in zip(shuffled, keep, strict=True) if k)
    return Workload(pods=kept, originals=len(kept), clones=0, dropped=dropped)


def shape_of(pod: TracePod) -> PodShape:
    return PodShape(
        cpu_milli=pod.cpu_milli,
        gpu_milli=pod.gpu_milli if pod.num_gpu else 0,
        num_gpu=pod.num_gpu,
        models=frozenset(pod.gpu_spec),
    )


def typical_shapes(pods: Sequence[TracePod], *, coverage: float = TYPICAL_COVERAGE) -> TargetWorkload:
    """FGD's target workload: the most frequent shapes of the original trace (before tuning)."""
    counts = Counter(shape_of(p) for p in sorted(pods, key=lambda p: p.name))
    gpu_milli = sum(p.total_gpu_milli for p in pods)
    memory = sum(p.memory_mib * MIB for p in pods if p.num_gpu)
    return TargetWorkload.from_counts(
        counts, coverage=coverage, memory_per_gpu_milli=memory / gpu_milli if gpu_milli else 0.0
    )
