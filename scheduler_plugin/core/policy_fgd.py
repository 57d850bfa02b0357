"""The `fgd` policy: Fragmentation Gradient Descent (Weng et al., USENIX ATC'23).

A node's score is how little the placement grows its fragmentation with respect to the target
workload (see `fragmentation.py`): with Δ the growth in milli-GPU (the pod's CPU counted too),
score = int(100 * sigmoid(-Δ / 1000)). The truncation to an integer is part of the published
result: ties are then broken by the core's fixed per-run node order, which packs; minimising the
exact Δ instead scores about a point lower on the Alibaba trace. For a share every GPU that can
take it is tried and the node scores its best GPU (lowest index among equal scores); that GPU is
the one `choose_share_gpus` returns.

The target workload comes from the option `workload` (a `TargetWorkload`, as the simulator builds
from the trace); without one it is learnt from the pods the core takes in (`workload_learning.py`),
and `GENERIC_WORKLOAD` stands in until the first one.

Cost: a `FragmentationTracker` keeps per-node counters in step with the core's state (a node is
refreshed only after it changed), and node scores are cached per demand shape and node version,
so a decision recomputes only the nodes changed since that shape was last scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import numpy as np

from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import Demand, share_milli
from scheduler_plugin.core.fragmentation import (
    MILLI,
    FloatArray,
    FragmentationIndex,
    IntArray,
    PodShape,
    TargetWorkload,
)
from scheduler_plugin.core.policies import BasePolicy, BoolMatrix, PolicyContext, SlotArray, register_policy
from scheduler_plugin.core.settings import NoParams, Option
from scheduler_plugin.core.workload_learning import WorkloadLearner

#: Stand-in target workload when the caller gives none: whole 1/2/4/8-GPU pods and common shares.
GENERIC_WORKLOAD = TargetWorkload(
    shapes=(
        PodShape(cpu_milli=0, gpu_milli=MILLI, num_gpu=1),
        PodShape(cpu_milli=0, gpu_milli=MILLI, num_gpu=2),
        PodShape(cpu_milli=0, gpu_milli=MILLI, num_gpu=4),
        PodShape(cpu_milli=0, gpu_milli=MILLI, num_gpu=8),
        PodShape(cpu_milli=0, gpu_milli=500, num_gpu=1),
        PodShape(cpu_milli=0, gpu_milli=250, num_gpu=1),
    ),
    weights=(0.4, 0.05, 0.05, 0.05, 0.25, 0.2),
)

#: CPU "free" for nodes whose CPU the core does not track: never the limiting resource.
_UNTRACKED_CPU = 1 << 40

NOT_FIT = -1.0


@dataclass(frozen=True)
class FragmentationOptions:
    """What the fragmentation-measuring policies (fgd, fgpu) can be handed."""

    workload: Annotated[
        TargetWorkload | None,
        Option("the target workload fragmentation is measured against; without it, learnt from the pods placed"),
    ] = None


def free_milli(state: ClusterState, rows: SlotArray) -> IntArray:
    """Free share per GPU slot in milli-GPU: the scarcer of compute and memory; 0 when unusable."""
    core_total = np.maximum(state.core_total[rows], 1)
    mem_total = np.maximum(state.mem_total[rows], 1)
    core = state.core_free[rows] * MILLI // core_total
    # Rounded, not floored: a ratio share of a GPU whose size is not a multiple of 100 must not
    # look a milli short of what compute says is free.
    mem = np.rint(state.mem_free[rows] * MILLI / mem_total).astype(np.int64)
    result: IntArray = np.where(state.gpu_usable[rows], np.minimum(core, mem), 0)
    return result


class FragmentationTracker:
    """A `FragmentationIndex` kept in step with the core's `ClusterState`, refreshed lazily."""

    def __init__(self, state: ClusterState, workload: TargetWorkload) -> None:
        self.state = state
        self.index = FragmentationIndex(workload=workload, capacity=state.capacity, max_gpus=state.max_gpus)
        self._dirty: set[int] = set(range(state.capacity))

    def node_changed(self, node: int) -> None:
        self._dirty.add(node)

    def state_resized(self) -> None:
        self.index.ensure_capacity(self.state.capacity, max_gpus=self.state.max_gpus)
        self._dirty.update(range(self.state.capacity))

    def refresh(self) -> None:
        if not self._dirty:
            return
        state = self.state
        rows = np.fromiter(sorted(self._dirty), dtype=np.intp, count=len(self._dirty))
        self._dirty.clear()
        cpu = np.where(state.cpu_alloc[rows] > 0, state.cpu_free[rows], _UNTRACKED_CPU)
        model_ok = np.zeros((len(rows), len(self.index.workload.shapes)), dtype=np.bool_)
        for k, row in enumerate(rows):
            if state.gpu_count[row] > 0 and state.active[row]:
                model_id = int(state.model_id[row, 0])
                if model_id >= 0:
                    model_ok[k] = self.index.model_mask(state.models[model_id])
                else:
                    model_ok[k] = self.index.model_mask("")
        self.index.set_rows(rows, free=free_milli(state, rows), cpu_free=cpu, model_ok=model_ok)


def fgd_score(delta: FloatArray, *, scale: float = MILLI) -> FloatArray:
    """int(100 * sigmoid(-Δ/scale)), the paper's integer score (scale 1000); NOT_FIT where Δ is +inf."""
    with np.errstate(over="ignore"):
        raw = (1.0 / (1.0 + np.exp(delta / scale))) * 100.0
    result: FloatArray = np.where(np.isinf(delta), NOT_FIT, np.trunc(raw))
    return result


DemandKey = tuple[int, int, int, bool, int, int, int]


def demand_key(demand: Demand) -> DemandKey:
    return (
        demand.gpus,
        demand.cpu_milli,
        demand.core_percent,
        demand.whole,
        -1 if demand.memory_bytes is None else demand.memory_bytes,
        -1 if demand.memory_ratio_percent is None else demand.memory_ratio_percent,
        share_milli(demand),
    )


@dataclass
class NodeDeltas:
    """Cached per-GPU fragmentation changes for one demand shape, valid while `version` matches the index.

    `delta[row, g]` is the change of putting (one card of) the demand on GPU g of the row; +inf where
    it can't go. Demands that don't choose a GPU (whole GPUs, CPU only) use column 0 only.
    """

    delta: FloatArray
    version: IntArray

    @classmethod
    def empty(cls, capacity: int, width: int) -> NodeDeltas:
        return cls(delta=np.full((capacity, width), np.inf), version=np.full(capacity, -1, dtype=np.int64))

    def fit(self, capacity: int, width: int) -> None:
        rows, cols = self.delta.shape
        if rows < capacity or cols < width:
            grown = np.full((max(rows, capacity), max(cols, width)), np.inf)
            grown[:rows, :cols] = self.delta
            self.delta = grown
            self.version = np.concatenate([self.version, np.full(max(0, capacity - rows), -1, dtype=np.int64)])


class CachedScorePolicy(BasePolicy):
    """A policy scoring nodes by an integer sigmoid of a per-GPU change that depends only on the
    node's row and the demand (cached per node version), plus an optional term that depends on
    the whole cluster (`dynamic`, recomputed every decision).

    Subclasses implement `deltas(rows, demand, fits) -> (K, G)` (or (K, 1)).
    """

    #: how many demand shapes to keep cached (oldest dropped first)
    max_cached_shapes = 512
    #: milli-GPU of change that moves the sigmoid score by about 25 points
    score_scale: float = MILLI

    def __init__(self, context: PolicyContext, *, workload: TargetWorkload | None) -> None:
        super().__init__(context)
        # Without a target workload (a live cluster) it is learnt from the pods the core takes
        # in (`pod_added`); the stand-in serves until the first one is learnt.
        self.learner = WorkloadLearner() if workload is None else None
        self.tracker = FragmentationTracker(self.state, workload or GENERIC_WORKLOAD)
        self._cache: dict[DemandKey, NodeDeltas] = {}

    @property
    def index(self) -> FragmentationIndex:
        return self.tracker.index

    def node_changed(self, node: int) -> None:
        self.tracker.node_changed(node)

    def state_resized(self) -> None:
        self.tracker.state_resized()

    def deltas(self, rows: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        raise NotImplementedError

    def dynamic(self, rows: SlotArray, demand: Demand, delta: FloatArray) -> FloatArray:
        """Extra change from cluster-wide state, same shape as `delta`; none by default."""
        return delta

    def _entry(self, demand: Demand) -> NodeDeltas:
        key = demand_key(demand)
        entry = self._cache.get(key)
        width = self.index.max_gpus
        if entry is None:
            if len(self._cache) >= self.max_cached_shapes:
                self._cache.pop(next(iter(self._cache)))
            entry = NodeDeltas.empty(self.index.capacity, width)
            self._cache[key] = entry
        entry.fit(self.index.capacity, width)
        return entry

    def _deltas_of(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        self.tracker.refresh()
        entry = self._entry(demand)
        version = self.index.version[nodes]
        stale = entry.version[nodes] != version
        if stale.any():
            rows = nodes[stale]
            fresh = self.deltas(rows, demand, fits[stale])
            entry.delta[rows] = np.inf
            entry.delta[rows, : fresh.shape[1]] = fresh
            entry.version[rows] = version[stale]
        return self.dynamic(nodes, demand, entry.delta[nodes])

    def workload_changed(self, workload: TargetWorkload) -> None:
        """Measures against `workload` from now on: every node's counters and cached score are redone."""
        self.tracker = FragmentationTracker(self.state, workload)
        self._cache.clear()

    def pod_added(self, demand: Demand) -> None:
        if self.learner is not None:
            learnt = self.learner.observe(demand)
            if learnt is not None:
                self.workload_changed(learnt)

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        scores = fgd_score(self._deltas_of(nodes, demand, fits), scale=self.score_scale)
        result: FloatArray = scores.max(axis=1)
        return result

    def choose_share_gpus(self, node: int, demand: Demand, fitting: SlotArray) -> Sequence[int]:
        if demand.gpus != 1:
            return super().choose_share_gpus(node, demand, fitting)
        fits = np.zeros((1, self.state.max_gpus), dtype=np.bool_)
        fits[0, fitting] = True
        scores = fgd_score(self._deltas_of(np.array([node], dtype=np.intp), demand, fits), scale=self.score_scale)[0]
        allowed = np.full(len(scores), False)
        allowed[fitting[fitting < len(scores)]] = True
        scores = np.where(allowed, scores, -np.inf)
        best = int(np.argmax(scores))  # first maximum: lowest GPU index among equal scores
        return [best] if allowed[best] and scores[best] > NOT_FIT else super().choose_share_gpus(node, demand, fitting)


class FGDPolicy(CachedScorePolicy):
    name = "fgd"

    def deltas(self, rows: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        """(K, G) for a 1-card share (+inf where a GPU can't take it), else (K, 1)."""
        if demand.is_share and demand.gpus == 1:
            delta = self.index.sharing_deltas(rows, cpu_milli=demand.cpu_milli, gpu_milli=share_milli(demand))
            fit_cols = np.zeros_like(delta, dtype=np.bool_)
            width = min(fits.shape[1], delta.shape[1])
            fit_cols[:, :width] = fits[:, :width]
            result: FloatArray = np.where(fit_cols, delta, np.inf)
            return result
        milli = share_milli(demand) if demand.gpus else 0
        exclusive = self.index.exclusive_deltas(rows, cpu_milli=demand.cpu_milli, gpu_milli=milli, num_gpu=demand.gpus)
        return exclusive[:, None]


register_policy(
    "fgd",
    lambda context, params, options: FGDPolicy(context, workload=options.workload),
    params=NoParams,
    options=FragmentationOptions,
    score="`int(100 * sigmoid(-Δfrag/1000))`: how little the placement grows the node's fragmentation",
    share_gpu="best FGD score, lowest index on ties",
)
