"""The target workload learnt from the pods the scheduler takes in.

FGD's fragmentation and fgpu's look-ahead terms are measured against a target workload: the
typical pod shapes and how often each comes. The simulator measures it on the trace; a live
scheduler has no trace, so without this it would score against a made-up stand-in. A
`WorkloadLearner` counts the shape (CPU, per-card milli-GPU, cards, allowed models) of every
pod it is shown and re-derives the typical shapes the way the simulator does
(`TargetWorkload.from_counts`: most frequent first, until `coverage` of the pods).

Re-deriving invalidates every cached node score, so it happens on a schedule: after `warmup`
demands (default 1: the first pods are placed against what is known of them, since early
placements shape the packing; waiting 64 pods with the stand-in cost 0.11 points on the Alibaba
trace), then whenever the count doubles, then every `relearn_every` demands. From then on the
counts are halved at each re-derivation, so the workload follows a cluster whose mix of pods
changes (the last ~2 x `relearn_every` demands weigh most).

A pod is counted once when the core takes it in (`Policy.pod_added`): when it is reserved, or
when it is found already bound, so a scheduler that restarts or takes over as leader relearns
from the pods running in the cluster. Pods that fit nowhere are not counted (nor do they change
the cluster). A pod unreserved and reserved again counts again.
"""

from __future__ import annotations

from collections import Counter

from scheduler_plugin.core.demand import Demand, share_milli
from scheduler_plugin.core.fragmentation import PodShape, TargetWorkload

#: demands seen before the first learnt workload replaces the stand-in
DEFAULT_WARMUP = 1
#: re-derive at least this often once the doubling schedule passes it
DEFAULT_RELEARN_EVERY = 4096
#: share of the counted pods the typical shapes cover (FGD's choice)
DEFAULT_COVERAGE = 0.95


def shape_of(demand: Demand) -> PodShape:
    """A demand's shape as FGD counts it: CPU-only pods are shapes too."""
    if not demand.gpus:
        return PodShape(cpu_milli=demand.cpu_milli, gpu_milli=0, num_gpu=0)
    return PodShape(
        cpu_milli=demand.cpu_milli,
        gpu_milli=share_milli(demand),
        num_gpu=demand.gpus,
        models=demand.model_use,
    )


class WorkloadLearner:
    def __init__(
        self,
        *,
        warmup: int = DEFAULT_WARMUP,
        relearn_every: int = DEFAULT_RELEARN_EVERY,
        coverage: float = DEFAULT_COVERAGE,
    ) -> None:
        if warmup < 1 or relearn_every < 1:
            raise ValueError(f"WorkloadLearner: warmup={warmup}, relearn_every={relearn_every}; both must be >= 1")
        if not 0 < coverage <= 1:
            raise ValueError(f"WorkloadLearner: coverage={coverage}; use a fraction in (0, 1]")
        self.relearn_every = relearn_every
        self.coverage = coverage
        self.seen = 0
        self._next = warmup
        self._counts: Counter[PodShape] = Counter()
        self._gpu_milli = 0.0
        self._memory = 0.0

    def observe(self, demand: Demand) -> TargetWorkload | None:
        """Counts one demand; a freshly derived workload when one is due, else None."""
        self.seen += 1
        self._counts[shape_of(demand)] += 1
        if demand.gpus:
            self._gpu_milli += share_milli(demand) * demand.gpus
            self._memory += demand.host_memory_bytes
        if self.seen < self._next:
            return None
        doubling = self.seen * 2 <= self.relearn_every
        self._next = self.seen * 2 if doubling else self.seen + self.relearn_every
        workload = TargetWorkload.from_counts(
            self._counts,
            coverage=self.coverage,
            memory_per_gpu_milli=self._memory / self._gpu_milli if self._gpu_milli else 0.0,
        )
        if not doubling:
            self._forget_half()
        return workload

    def _forget_half(self) -> None:
        # Integer halving: a shape seen once in the last two windows drops out, as it should.
        self._counts = Counter({shape: count // 2 for shape, count in self._counts.items() if count >= 2})
        self._gpu_milli /= 2
        self._memory /= 2
