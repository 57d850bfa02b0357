"""FGD's fragmentation measure, kept per node and updated incrementally.

A node's fragment for one target pod shape (Weng et al., USENIX ATC'23, and the trace README):
  * CPU-only shape: all of the node's idle GPU (it can never use it);
  * shape that can't run there (CPU short, model not allowed, fewer than `num_gpu` GPUs whose free
    share >= its per-GPU request; memory ignored): all of the node's idle GPU;
  * otherwise: the idle share on GPUs whose free share is below its per-GPU request.
The node's fragmentation is the frequency-weighted sum over the target workload's shapes.

Units are milli-GPU (1000 = one GPU) throughout. `FragmentationIndex` keeps, per node, the GPU
free list, the CPU left and per-shape counters, so the fragmentation change of a candidate
placement costs O(shapes) per candidate GPU, vectorised with numpy over all candidate nodes.
Absent GPU slots (a 2-GPU node in an 8-wide table) hold 0 free, which no shape can use and which
adds nothing to any fragment, so they need no special case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

MILLI = 1000

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, order=True)
class PodShape:
    """A pod's resource shape as FGD sees it (memory plays no part in fragmentation)."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for a CPU-only pod
    num_gpu: int
    models: frozenset[str] = frozenset()  # allowed GPU models; empty = any

    def allows(self, model: str) -> bool:
        return not self.models or model in self.models


@dataclass(frozen=True)
class TargetWorkload:
    """The "typical" shapes and their normalised frequencies."""

    shapes: tuple[PodShape, ...]
    weights: tuple[float, ...]
    #: host memory (bytes) the workload's GPU pods ask per milli-GPU; 0 = unknown
    memory_per_gpu_milli: float = 0.0

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights):
            raise ValueError(f"TargetWorkload: {len(self.shapes)} shapes but {len(self.weights)} weights; give one weight per shape")
        if any(w < 0 for w in self.weights):
            raise ValueError(f"TargetWorkload: negative weight in {self.weights}; weights are frequencies >= 0")

    @classmethod
    def from_counts(
        cls, counts: Mapping[PodShape, int], *, coverage: float = 0.95, memory_per_gpu_milli: float = 0.0
    ) -> TargetWorkload:
        """Takes shapes by count (descending, stable) until `coverage` of all pods, then renormalises."""
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage = {coverage}; use a fraction in (0, 1]")
        total = sum(counts.values())
        if total <= 0:
            raise ValueError("TargetWorkload.from_counts: no pods counted; give at least one shape a count > 0")
        chosen: list[tuple[PodShape, int]] = []
        cumulative = 0
        for shape, count in sorted(counts.items(), key=lambda kv: -kv[1]):
            chosen.append((shape, count))
            cumulative += count
            if cumulative >= coverage * total:
                break
        kept = sum(c for _, c in chosen)
        return cls(
            shapes=tuple(s for s, _ in chosen),
            weights=tuple(c / kept for _, c in chosen),
            memory_per_gpu_milli=memory_per_gpu_milli,
        )

    @cached_property
    def cpu_per_gpu_milli(self) -> float:
        """CPU milli the workload's GPU shapes ask per milli-GPU (frequency-weighted); 0 = none ask CPU."""
        gpu_volume = sum(w * s.gpu_milli * s.num_gpu for s, w in zip(self.shapes, self.weights, strict=True))
        cpu = sum(w * s.cpu_milli for s, w in zip(self.shapes, self.weights, strict=True) if s.num_gpu)
        return cpu / gpu_volume if gpu_volume > 0 else 0.0

    @cached_property
    def cpu(self) -> IntArray:
        return np.array([s.cpu_milli for s in self.shapes], dtype=np.int64)

    @cached_property
    def milli(self) -> IntArray:
        # CPU-only shapes get an impossible per-GPU request, so every GPU counts as "too small"
        # for them; `gpu_shape` then routes them to "all idle" anyway.
        return np.array([s.gpu_milli if s.num_gpu else MILLI + 1 for s in self.shapes], dtype=np.int64)

    @cached_property
    def num(self) -> IntArray:
        return np.array([s.num_gpu for s in self.shapes], dtype=np.int64)

    @cached_property
    def gpu_shape(self) -> BoolArray:
        return np.array([s.num_gpu > 0 for s in self.shapes], dtype=np.bool_)

    @cached_property
    def weight(self) -> FloatArray:
        return np.array(self.weights, dtype=np.float64)

    def model_mask(self, model: str) -> BoolArray:
        return np.array([s.allows(model) for s in self.shapes], dtype=np.bool_)


def shape_fragments(
    *, free: IntArray, cpu_free: IntArray, model_ok: BoolArray, workload: TargetWorkload
) -> tuple[IntArray, IntArray, IntArray]:
    """Per node (rows of `free`, shape (K, G)) and shape: (fits count, under-request idle, fragment).

    All three are (K, S) integer arrays; the fragment is in milli-GPU.
    """
    ge = free[:, :, None] >= workload.milli[None, None, :]
    count = ge.sum(axis=1)
    under = np.where(ge, 0, free[:, :, None]).sum(axis=1)
    idle = free.sum(axis=1)
    fits = (
        workload.gpu_shape[None, :]
        & model_ok
        & (cpu_free[:, None] >= workload.cpu[None, :])
        & (count >= workload.num[None, :])
    )
    fragment = np.where(fits, under, idle[:, None])
    return count, under, fragment


def node_fragmentation(*, gpu_free_milli: Sequence[int], cpu_free_milli: int, model: str, workload: TargetWorkload) -> float:
    """One node's fragmentation (milli-GPU), without an index: for views, plans and tests."""
    free = np.array([list(gpu_free_milli)], dtype=np.int64).reshape(1, -1)
    _, _, fragment = shape_fragments(
        free=free,
        cpu_free=np.array([cpu_free_milli], dtype=np.int64),
        model_ok=workload.model_mask(model)[None, :],
        workload=workload,
    )
    return float(fragment[0] @ workload.weight)


class FragmentationIndex:
    """Per-node fragmentation caches for a whole cluster, with vectorised placement deltas.

    Rows are the caller's node slots (the core's `ClusterState` slots). `version[row]` bumps on
    every change, so callers can cache per-node results and recompute only stale rows.
    """

    def __init__(self, *, workload: TargetWorkload, capacity: int = 0, max_gpus: int = 8) -> None:
        self.workload = workload
        self.max_gpus = max_gpus
        self._model_masks: dict[str, BoolArray] = {}
        self.capacity = 0
        shapes = len(workload.shapes)
        self.free: IntArray = np.zeros((0, max_gpus), dtype=np.int64)
        self.cpu_free: IntArray = np.zeros(0, dtype=np.int64)
        self.model_ok: BoolArray = np.zeros((0, shapes), dtype=np.bool_)
        self.count: IntArray = np.zeros((0, shapes), dtype=np.int64)
        self.under: IntArray = np.zeros((0, shapes), dtype=np.int64)
        self.fragment: IntArray = np.zeros((0, shapes), dtype=np.int64)
        self.node_frag: FloatArray = np.zeros(0, dtype=np.float64)
        self.version: IntArray = np.zeros(0, dtype=np.int64)
        self.ensure_capacity(capacity, max_gpus=max_gpus)

    def ensure_capacity(self, capacity: int, *, max_gpus: int | None = None) -> None:
        """Grows the tables (new rows are empty nodes: no GPU, no fragment)."""
        gpus = max(self.max_gpus, max_gpus or 0)
        if capacity <= self.capacity and gpus == self.max_gpus:
            return
        capacity = max(capacity, self.capacity)

        def grown(old: npt.NDArray[np.generic], shape: tuple[int, ...]) -> npt.NDArray[np.generic]:
            new = np.zeros(shape, dtype=old.dtype)
            new[tuple(slice(0, n) for n in old.shape)] = old
            return new

        shapes = len(self.workload.shapes)
        self.free = grown(self.free, (capacity, gpus))  # type: ignore[assignment]
        self.cpu_free = grown(self.cpu_free, (capacity,))  # type: ignore[assignment]
        self.model_ok = grown(self.model_ok, (capacity, shapes))  # type: ignore[assignment]
        self.count = grown(self.count, (capacity, shapes))  # type: ignore[assignment]
        self.under = grown(self.under, (capacity, shapes))  # type: ignore[assignment]
        self.fragment = grown(self.fragment, (capacity, shapes))  # type: ignore[assignment]
        self.node_frag = grown(self.node_frag, (capacity,))  # type: ignore[assignment]
        self.version = grown(self.version, (capacity,))  # type: ignore[assignment]
        self.capacity = capacity
        self.max_gpus = gpus

    def model_mask(self, model: str) -> BoolArray:
        mask = self._model_masks.get(model)
        if mask is None:
            mask = self.workload.model_mask(model)
            self._model_masks[model] = mask
        return mask

    def set_rows(self, rows: IntArray, *, free: IntArray, cpu_free: IntArray, model_ok: BoolArray) -> None:
        """Replaces the state of `rows`: free milli per GPU slot (K, G), CPU left (K,), allowed shapes (K, S)."""
        if len(rows) == 0:
            return
        self.ensure_capacity(int(rows.max()) + 1, max_gpus=free.shape[1])
        if free.shape[1] < self.max_gpus:
            free = np.pad(free, ((0, 0), (0, self.max_gpus - free.shape[1])))
        self.free[rows] = free
        self.cpu_free[rows] = cpu_free
        self.model_ok[rows] = model_ok
        count, under, fragment = shape_fragments(free=free, cpu_free=cpu_free, model_ok=model_ok, workload=self.workload)
        self.count[rows] = count
        self.under[rows] = under
        self.fragment[rows] = fragment
        self.node_frag[rows] = fragment @ self.workload.weight
        self.version[rows] += 1

    def set_node(self, row: int, *, model: str, gpu_free_milli: Sequence[int], cpu_free_milli: int) -> None:
        """`set_rows` for one node, by GPU index."""
        free = np.zeros((1, max(self.max_gpus, len(gpu_free_milli))), dtype=np.int64)
        free[0, : len(gpu_free_milli)] = np.asarray(gpu_free_milli, dtype=np.int64)
        self.set_rows(
            np.array([row]),
            free=free,
            cpu_free=np.array([cpu_free_milli], dtype=np.int64),
            model_ok=self.model_mask(model)[None, :],
        )

    def clear_rows(self, rows: IntArray) -> None:
        """Forgets nodes (released slots): they hold nothing and fragment nothing."""
        self.set_rows(
            rows,
            free=np.zeros((len(rows), self.max_gpus), dtype=np.int64),
            cpu_free=np.zeros(len(rows), dtype=np.int64),
            model_ok=np.zeros((len(rows), len(self.workload.shapes)), dtype=np.bool_),
        )

    def total(self, rows: IntArray | None = None) -> float:
        """The fragmentation (milli-GPU) of `rows`, or of every row."""
        return float(self.node_frag.sum() if rows is None else self.node_frag[rows].sum())

    # --- deltas of candidate placements ---
    def sharing_deltas(self, rows: IntArray, *, cpu_milli: int, gpu_milli: int) -> FloatArray:
        """(K, G): fragmentation change of putting a 1-GPU share on each GPU of each row.

        +inf where the GPU lacks `gpu_milli` free. O(S) per (row, GPU), from the cached counters.
        """
        w = self.workload
        f = self.free[rows][:, :, None]
        left = f - gpu_milli
        was = f >= w.milli[None, None, :]
        now = left >= w.milli[None, None, :]
        count2 = self.count[rows][:, None, :] - was + now
        under2 = self.under[rows][:, None, :] - np.where(was, 0, f) + np.where(now, 0, left)
        idle2 = self.free[rows].sum(axis=1)[:, None] - gpu_milli
        cpu2 = self.cpu_free[rows] - cpu_milli
        fits2 = (
            w.gpu_shape[None, None, :]
            & self.model_ok[rows][:, None, :]
            & (cpu2[:, None, None] >= w.cpu[None, None, :])
            & (count2 >= w.num[None, None, :])
        )
        frag2 = np.where(fits2, under2, idle2[:, :, None])
        # Integer per-shape differences first: an unchanged node gives exactly 0, not float noise.
        delta = (frag2 - self.fragment[rows][:, None, :]) @ w.weight
        return np.where(self.free[rows] >= gpu_milli, delta, np.inf)

    def exclusive_after(self, rows: IntArray, *, gpu_milli: int, num_gpu: int) -> IntArray:
        """Free lists after taking the `num_gpu` lowest-indexed GPUs with >= `gpu_milli` free."""
        free = self.free[rows]
        if num_gpu == 0:
            return free.copy()
        ok = free >= gpu_milli
        take = ok & (np.cumsum(ok, axis=1) <= num_gpu)
        return free - np.where(take, gpu_milli, 0)

    def exclusive_deltas(self, rows: IntArray, *, cpu_milli: int, gpu_milli: int, num_gpu: int) -> FloatArray:
        """(K,): fragmentation change of an n-GPU (or CPU-only, n = 0) pod on each row."""
        after = self.exclusive_after(rows, gpu_milli=gpu_milli, num_gpu=num_gpu)
        _, _, fragment = shape_fragments(
            free=after,
            cpu_free=self.cpu_free[rows] - cpu_milli,
            model_ok=self.model_ok[rows],
            workload=self.workload,
        )
        return (fragment - self.fragment[rows]) @ self.workload.weight


class HoleWaste:
    """The share of a partly used GPU expected to stay unused for good: a look-ahead over the workload.

    FGD asks whether the *next* pod could use a GPU's free share. This asks what happens when pods
    keep arriving from the target workload and each lands in the hole if it fits: a hole of r milli
    ends with waste V(r), where V(r) = r when no allowed shape fits and otherwise the
    frequency-weighted mean of V(r - m) over the shapes of per-GPU request m <= r (multi-GPU shapes
    count once per GPU). So a 530 hole, which a 470 pod will likely fill, is cheap, and a 190 hole,
    which almost nothing fills, costs about its size. Which shapes are allowed depends on the node
    (its model, and its CPU: a shape needing more CPU than is left never comes), so there is one V
    table per distinct allowed set, built on first use.

    Pods are not dropped into the first hole they fit: a placement policy steers each to the hole it
    fills best. With `temperature` T > 0 (milli-GPU) the shapes that fit a hole are weighted by
    frequency x exp(-(V(r - m) - best) / T), so a hole goes mostly to the shapes that leave the
    least eventual waste in it: a 680 hole waits for a 650 pod (30 left), not the more frequent
    470 (210 left) that a 530 hole takes better. T = 0 is the unsteered mean.
    """

    STEP = 10

    def __init__(self, workload: TargetWorkload, *, fill_supply: float = 0.0, temperature: float = 0.0) -> None:
        self.workload = workload
        self.fill_supply = fill_supply
        self.temperature = temperature
        gpu = workload.gpu_shape
        self._gpu = gpu
        self._request = np.where(gpu, np.minimum(workload.milli, MILLI), 0) // self.STEP
        # A share sized only in memory bytes counts 0 milli-GPU: it fills no hole measurably, and
        # as a filler of size 0 it would make every hole look filled.
        self._rate = workload.weight * np.where(gpu & (self._request >= 1), np.maximum(workload.num, 1), 0)
        self._ids: dict[bytes, int] = {}
        self._tables: list[FloatArray] = []
        self.table: FloatArray = np.zeros((0, MILLI // self.STEP + 1))

    def _build(self, allowed: BoolArray) -> FloatArray:
        size = MILLI // self.STEP + 1
        request = self._request[allowed & self._gpu]
        rate = self._rate[allowed & self._gpu]
        values = np.zeros(size)
        for r in range(1, size):
            fit = (request <= r) & (rate > 0)
            if not fit.any():
                values[r] = r * self.STEP
            else:
                left = values[r - request[fit]]
                weight = rate[fit]
                if self.temperature > 0:
                    weight = weight * np.exp(-(left - left.min()) / self.temperature)
                filled = float((weight * left).sum() / weight.sum())
                # Many holes compete for the few pods small enough to fill them: a hole that only a
                # rare shape fits is filled with probability (frequency of fitting shapes) / supply.
                chance = min(1.0, float(rate[fit].sum()) / self.fill_supply) if self.fill_supply > 0 else 1.0
                values[r] = chance * filled + (1.0 - chance) * r * self.STEP
        return values

    def table_ids(self, *, model_ok: BoolArray, cpu_free: IntArray) -> IntArray:
        """The V table of each node (rows of `model_ok` / `cpu_free`)."""
        allowed = model_ok & (cpu_free[:, None] >= self.workload.cpu[None, :]) & self._gpu[None, :]
        if allowed.shape[1] <= 62:
            # Only GPU shapes matter and there are few: one integer per allowed set is a fast key.
            packed = allowed.astype(np.int64) @ (np.int64(1) << np.arange(allowed.shape[1], dtype=np.int64))
            keys, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
            raws = [int(k).to_bytes(8, "little") for k in keys]
        else:
            rows = np.packbits(allowed, axis=1)
            unique_rows, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
            raws = [row.tobytes() for row in unique_rows]
        ids = np.empty(len(raws), dtype=np.int64)
        grew = False
        for k, raw in enumerate(raws):
            known = self._ids.get(raw)
            if known is None:
                known = len(self._tables)
                self._tables.append(self._build(allowed[int(first[k])]))
                self._ids[raw] = known
                grew = True
            ids[k] = known
        if grew:
            self.table = np.vstack(self._tables)
        result: IntArray = ids[inverse.ravel()]
        return result

    def node_waste(self, free: IntArray, ids: IntArray) -> FloatArray:
        """Expected eventual waste (milli-GPU) per node: the sum over its GPUs."""
        result: FloatArray = self.table[ids[:, None], free // self.STEP].sum(axis=1)
        return result

    def sharing_deltas(self, *, free: IntArray, ids_before: IntArray, ids_after: IntArray, gpu_milli: int) -> FloatArray:
        """(K, G): change of the node's waste when a share of `gpu_milli` lands on each GPU."""
        table = self.table
        before = self.node_waste(free, ids_before)
        after_all = self.node_waste(free, ids_after)
        cells = free // self.STEP
        left = np.maximum(free - gpu_milli, 0) // self.STEP
        after = after_all[:, None] - table[ids_after[:, None], cells] + table[ids_after[:, None], left]
        result: FloatArray = after - before[:, None]
        return result
