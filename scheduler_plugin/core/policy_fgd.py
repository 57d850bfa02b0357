"""The `fgd` policy: Fragmentation Gradient Descent (Weng et al., USENIX ATC'23).

A node's score is how little the placement grows its fragmentation with respect to the target
workload (see `fragmentation.py`): with Δ the growth in milli-GPU (the pod's CPU counted too),
score = int(100 * sigmoid(-Δ / 1000)). The truncation to an integer is part of the published
result: ties are then broken by the core's fixed per-run node order, which packs; minimising the
exact Δ instead scores about a point lower on the Alibaba trace. For a share every GPU that can
take it is tried and the node scores its best GPU (lowest index among equal scores); that GPU is
the one `choose_share_gpus` returns.

The target workload comes from `PolicyContext.options["workload"]` (a `TargetWorkload`, as the
simulator builds from the trace); without one, `GENERIC_WORKLOAD` stands in.

Cost: a `FragmentationTracker` keeps per-node counters in step with the core's state (a node is
refreshed only after it changed), and node scores are cached per demand shape and node version,
so a decision recomputes only the nodes changed since that shape was last scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import FULL_PERCENT, Demand
from scheduler_plugin.core.fragmentation import (
    MILLI,
    FloatArray,
    FragmentationIndex,
    IntArray,
    PodShape,
    TargetWorkload,
)
from scheduler_plugin.core.policies import BasePolicy, BoolMatrix, PolicyContext, SlotArray, register_policy

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


def share_milli(demand: Demand) -> int:
    """Per-card request in milli-GPU: the larger of its compute and memory-ratio parts."""
    if demand.whole:
        return MILLI
    percent = max(demand.core_percent, demand.memory_ratio_percent or 0)
    return min(MILLI, percent * MILLI // FULL_PERCENT)


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


def fgd_score(delta: FloatArray) -> FloatArray:
    """int(100 * sigmoid(-Δ/1000)), the paper's integer score; NOT_FIT where Δ is +inf."""
    with np.errstate(over="ignore"):
        raw = (1.0 / (1.0 + np.exp(delta / MILLI))) * 100.0
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
class NodeScores:
    """Cached per-node results for one demand shape, valid while `version` matches the index."""

    score: FloatArray
    gpu: IntArray
    version: IntArray

    @classmethod
    def empty(cls, capacity: int) -> NodeScores:
        return cls(
            score=np.full(capacity, NOT_FIT),
            gpu=np.full(capacity, -1, dtype=np.int64),
            version=np.full(capacity, -1, dtype=np.int64),
        )

    def fit(self, capacity: int) -> None:
        if len(self.score) < capacity:
            extra = capacity - len(self.score)
            self.score = np.concatenate([self.score, np.full(extra, NOT_FIT)])
            self.gpu = np.concatenate([self.gpu, np.full(extra, -1, dtype=np.int64)])
            self.version = np.concatenate([self.version, np.full(extra, -1, dtype=np.int64)])


class CachedScorePolicy(BasePolicy):
    """A policy whose node scores depend only on the node's row and the demand: cached per version.

    Subclasses implement `compute(rows, demand, fits) -> (scores, share GPU or -1)`.
    """

    #: how many demand shapes to keep cached (least recently added dropped first)
    max_cached_shapes = 512

    def __init__(self, context: PolicyContext, *, workload: TargetWorkload | None = None) -> None:
        super().__init__(context)
        chosen = workload or context.options.get("workload") or GENERIC_WORKLOAD
        if not isinstance(chosen, TargetWorkload):
            raise TypeError(
                f"policy {self.name!r}: options['workload'] is a {type(chosen).__name__}; pass a TargetWorkload"
            )
        self.tracker = FragmentationTracker(self.state, chosen)
        self._cache: dict[DemandKey, NodeScores] = {}

    @property
    def index(self) -> FragmentationIndex:
        return self.tracker.index

    def node_changed(self, node: int) -> None:
        self.tracker.node_changed(node)

    def state_resized(self) -> None:
        self.tracker.state_resized()

    def compute(self, rows: SlotArray, demand: Demand, fits: BoolMatrix) -> tuple[FloatArray, IntArray]:
        raise NotImplementedError

    def _entry(self, demand: Demand) -> NodeScores:
        key = demand_key(demand)
        entry = self._cache.get(key)
        if entry is None:
            if len(self._cache) >= self.max_cached_shapes:
                self._cache.pop(next(iter(self._cache)))
            entry = NodeScores.empty(self.index.capacity)
            self._cache[key] = entry
        entry.fit(self.index.capacity)
        return entry

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        self.tracker.refresh()
        entry = self._entry(demand)
        version = self.index.version[nodes]
        stale = entry.version[nodes] != version
        if stale.any():
            rows = nodes[stale]
            scores, gpus = self.compute(rows, demand, fits[stale])
            entry.score[rows] = scores
            entry.gpu[rows] = gpus
            entry.version[rows] = version[stale]
        result: FloatArray = entry.score[nodes]
        return result

    def choose_share_gpus(self, node: int, demand: Demand, fitting: SlotArray) -> Sequence[int]:
        if demand.gpus != 1:
            return super().choose_share_gpus(node, demand, fitting)
        self.tracker.refresh()
        entry = self._entry(demand)
        if entry.version[node] == self.index.version[node] and int(entry.gpu[node]) in set(fitting.tolist()):
            return [int(entry.gpu[node])]
        fits = np.zeros((1, self.index.max_gpus), dtype=np.bool_)
        fits[0, fitting] = True
        _, gpus = self.compute(np.array([node], dtype=np.intp), demand, fits)
        return [int(gpus[0])] if gpus[0] >= 0 else super().choose_share_gpus(node, demand, fitting)


class FGDPolicy(CachedScorePolicy):
    name = "fgd"

    def deltas(self, rows: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        """(K, G) for a 1-card share (+inf where a GPU can't take it), else (K, 1)."""
        if demand.is_share and demand.gpus == 1:
            delta = self.index.sharing_deltas(rows, cpu_milli=demand.cpu_milli, gpu_milli=share_milli(demand))
            fit_cols = np.zeros_like(delta, dtype=np.bool_)
            fit_cols[:, : fits.shape[1]] = fits[:, : delta.shape[1]]
            result: FloatArray = np.where(fit_cols, delta, np.inf)
            return result
        milli = share_milli(demand) if demand.gpus else 0
        exclusive = self.index.exclusive_deltas(
            rows, cpu_milli=demand.cpu_milli, gpu_milli=milli, num_gpu=demand.gpus
        )
        return exclusive[:, None]

    def compute(self, rows: SlotArray, demand: Demand, fits: BoolMatrix) -> tuple[FloatArray, IntArray]:
        scores = fgd_score(self.deltas(rows, demand, fits))
        if scores.shape[1] == 1:
            return scores[:, 0], np.full(len(rows), -1, dtype=np.int64)
        best = np.argmax(scores, axis=1)  # first maximum: lowest GPU index among equal scores
        return scores[np.arange(len(rows)), best], best.astype(np.int64)


register_policy("fgd", FGDPolicy)
