"""How fragmented the cluster the core holds is: FGD's measure, as the simulator takes it.

The churn replay (`sim/churn.py`) keeps a `FragmentationTracker` on its core and reads
`index.total()`; the descheduler's trigger calls `measure` on the core it loaded from the API, so
both read the same code (`core/policy_fgd.py`, `core/fragmentation.py`). The target workload is
the shapes of the pods it is given (bound and pending), as `WorkloadLearner` and the simulator's
`typical_shapes` derive it (most frequent shapes up to 95 % of the pods); with no GPU pod it is
the policies' stand-in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from scheduler_plugin.core.demand import Demand
from scheduler_plugin.core.fragmentation import MILLI, PodShape, TargetWorkload
from scheduler_plugin.core.policy_fgd import GENERIC_WORKLOAD, FragmentationTracker, free_milli
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.core.workload_learning import DEFAULT_COVERAGE, shape_of


@dataclass(frozen=True)
class Fragmentation:
    #: FGD's fragmentation: free GPU (milli) the target workload's shapes cannot use, weighted by frequency
    fragmented_milli: float
    #: free GPU share (milli) on usable GPUs
    idle_milli: int
    capacity_milli: int

    @property
    def of_idle(self) -> float:
        """Share (0..1) of the idle GPU that is fragmented: the ratio the `FgpuGPUPodsPendingWhileFragmented`
        alert uses."""
        return min(1.0, self.fragmented_milli / self.idle_milli) if self.idle_milli > 0 else 0.0

    @property
    def pct_of_capacity(self) -> float:
        """% of all GPU capacity: the simulator's `frag_pct`."""
        return self.fragmented_milli / self.capacity_milli * 100 if self.capacity_milli > 0 else 0.0


def workload_of(demands: Iterable[Demand]) -> TargetWorkload:
    counts: Counter[PodShape] = Counter(shape_of(d) for d in demands)
    if not any(shape.num_gpu for shape in counts):
        return GENERIC_WORKLOAD
    return TargetWorkload.from_counts(counts, coverage=DEFAULT_COVERAGE)


def measure(core: Scheduler, workload: TargetWorkload) -> Fragmentation:
    state = core.state
    tracker = FragmentationTracker(state, workload)
    tracker.refresh()
    rows = state.active_slots()
    gpu_rows = rows[state.gpu_count[rows] > 0]
    idle = int(free_milli(state, gpu_rows).sum()) if len(gpu_rows) else 0
    capacity = int(np.sum(state.gpu_count[gpu_rows])) * MILLI
    return Fragmentation(fragmented_milli=float(tracker.index.total()), idle_milli=idle, capacity_milli=capacity)
