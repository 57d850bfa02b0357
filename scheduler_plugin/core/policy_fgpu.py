"""The `fgpu` policy: FGD's fragmentation measure, the GPU that CPU or memory shortage strands, and the eventual waste of holes.

FGD (see `policy_fgd.py`) counts a node's idle GPU as fragmented for a pod shape only once the
node's CPU is *already* too short for that shape. Replaying the Alibaba trace shows where this
loses: CPU-heavy pods (CPU-only pods, shares asking 12 cores for half a GPU) drain the CPU of
GPU-dense nodes, so by the time the cluster saturates whole GPUs sit idle on nodes with no CPU
left for any pod. fgpu looks ahead at that: the workload's GPU pods ask, on average, rho CPU milli
(and mu bytes of memory) per milli-GPU, so a node with `idle` milli-GPU free can only ever use
min(idle, cpu_free / rho, mem_free / mu) of it. The rest is stranded:

    stranded = max(0, idle - cpu_free / rho, idle - mem_free / mu)

fgpu scores a placement by the growth of FGD's fragmentation plus `strand_weight` times the
growth of the stranded GPU, through FGD's integer sigmoid score and the core's fixed node-order
tie-break (which packs). A CPU-heavy pod therefore goes to a CPU-rich node (or one whose GPUs are
already taken), and a GPU-heavy pod to a GPU-dense one. The GPU of a share is chosen as in FGD
(stranding is a node quantity: equal for every GPU of the node).

rho comes from the target workload's GPU shapes and mu from `TargetWorkload.memory_per_gpu_milli`:
measured on the trace by the simulator, or learnt with the workload from the pods placed
(`workload_learning.py`) in a live cluster.

The third term is the growth of the node's expected eventual hole waste (`HoleWaste`): what stays
unused of its partly used GPUs once the workload's pods keep arriving and each goes to the hole it
fills best. Weighted 15x, it decides most share placements; FGD's fragmentation and stranding then
separate nodes whose holes are alike (and keep whole GPUs whole, which the hole waste of a free GPU
barely sees). Its tables depend on the node's CPU left, not its GPU model: a table per model would
make the GPUs that model-constrained pods need look the cheapest to fill and draw unconstrained
shares onto them (FGD's own term keeps placement model-aware).

Two more things keep the look-ahead honest beyond the workloads it was tuned on
(docs/simulator.md, "fgpu"). Model-constrained pods: a pod taking GPU of a model that the
workload's constrained shapes need (`model_pressure`) pays for it, beyond the least needed model it
may use, with the hole-waste weight (both are milli-GPU expected to go unused); without it the
model-neutral terms drew free pods onto the GPUs constrained pods need. Multi-GPU pods: both
look-ahead terms price GPU taken in pieces of one GPU or less, so their weights are scaled by the
share of the workload's GPU volume in such pods (`single_gpu_volume`); for pods that need n GPUs
and their CPU on one node at once, FGD's per-shape test is the measure, plus the spots for them a
placement takes (`LumpShapes`: how many of each multi-GPU shape a node can still host, GPUs and CPU
together), each priced by how short the cluster is of room for that shape (`lump_pressure`); on
`--multi-gpu 30` this keeps the only nodes that take its widest pods for them.

Parameters: `FGPUParams` (the weights of the two look-ahead terms, how the hole-waste estimate
expects pods to arrive, and the resource ratios, learnt unless pinned).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

import numpy as np

from scheduler_plugin.core.demand import Demand, share_milli
from scheduler_plugin.core.fragmentation import (
    BoolArray,
    FloatArray,
    HoleWaste,
    IntArray,
    TargetWorkload,
)
from scheduler_plugin.core.policies import BoolMatrix, PolicyContext, SlotArray, register_policy
from scheduler_plugin.core.policy_fgd import FGDPolicy, FragmentationOptions
from scheduler_plugin.core.settings import Param

_LEARNT = "learnt with the workload"


@dataclass(frozen=True)
class FGPUParams:
    strand_weight: Annotated[float, Param("weight of the GPU stranded by CPU/memory shortage")] = 3.0
    hole_weight: Annotated[float, Param("weight of the expected eventual waste of partly used GPUs")] = 15.0
    #: milli-GPU of eventual waste over which a pod's preference between two holes fades (see `HoleWaste`)
    fill_temperature: Annotated[
        float,
        Param(
            "how sharply that estimate expects arriving pods to prefer the holes they fill best, in milli-GPU "
            "(0 = they take the first hole they fit)"
        ),
    ] = 30.0
    #: frequency of fitting shapes at which a hole is sure to be filled (see `HoleWaste`)
    fill_supply: Annotated[
        float, Param("frequency of fitting pods at which a hole is sure to be filled (0 = always filled)")
    ] = 0.04
    #: 1: the term is the milli-GPU of multi-GPU pods expected to be refused, the unit of Δfrag itself
    lump_weight: Annotated[
        float, Param("weight of the multi-GPU pods expected to be refused for the spots a placement takes (0 = off)")
    ] = 1.0
    cpu_per_gpu_milli: Annotated[
        float | None, Param("pins the workload's CPU milli per milli-GPU (0 leaves CPU out)", unset=_LEARNT)
    ] = None
    memory_per_gpu_milli: Annotated[
        float | None,
        Param("pins the workload's host-memory bytes per milli-GPU (0 leaves memory out)", unset=_LEARNT),
    ] = None


@dataclass(frozen=True)
class ResourceRatios:
    """CPU milli and host-memory bytes the workload's GPU pods ask per milli-GPU (0 = not tracked)."""

    cpu: float
    memory: float


def model_pressure(workload: TargetWorkload, gpus_by_model: Mapping[str, int]) -> dict[str, float]:
    """Per model: the share of its GPUs that the workload's model-constrained pods need once the cluster is full.

    A constrained shape s of GPU-volume share f_s (of all the workload's GPU volume) brings f_s x C
    of demand when the cluster (C GPUs) fills, spread over its allowed models by their size, so
    model M gets f_s x C x C_M / C(S_s) of it: a share f_s x C / C(S_s) of M's GPUs. Capped at 1:
    past it the model is wholly needed.
    """
    total = sum(gpus_by_model.values())
    volume = sum(w * s.gpu_milli * s.num_gpu for s, w in zip(workload.shapes, workload.weights, strict=True))
    pressure = dict.fromkeys(gpus_by_model, 0.0)
    if total <= 0 or volume <= 0:
        return pressure
    for shape, weight in zip(workload.shapes, workload.weights, strict=True):
        if not shape.num_gpu or not shape.models:
            continue
        serving = sum(gpus_by_model.get(m, 0) for m in shape.models)
        if serving <= 0:
            continue  # a shape no GPU here can run claims nothing
        claim = weight * shape.gpu_milli * shape.num_gpu / volume * total / serving
        for model in shape.models:
            if model in pressure:
                pressure[model] += claim
    return {model: min(1.0, value) for model, value in pressure.items()}


def single_gpu_volume(workload: TargetWorkload) -> float:
    """Share of the workload's GPU volume asked by pods of one GPU or less (1 when it asks none)."""
    volume = sum(w * s.gpu_milli * s.num_gpu for s, w in zip(workload.shapes, workload.weights, strict=True))
    single = sum(w * s.gpu_milli for s, w in zip(workload.shapes, workload.weights, strict=True) if s.num_gpu == 1)
    return single / volume if volume > 0 else 1.0


@dataclass(frozen=True)
class LumpShapes:
    """The workload's multi-GPU shapes: per shape its GPUs, CPU, per-GPU request and share of the GPU volume."""

    index: IntArray  # position among the workload's shapes (for the per-node model mask)
    gpus: IntArray
    cpu: IntArray
    volume_share: FloatArray
    levels: IntArray  # the distinct per-GPU requests (mostly just a whole GPU)
    level: IntArray  # per shape: which of `levels` it asks per GPU

    @classmethod
    def of(cls, workload: TargetWorkload) -> LumpShapes:
        volume = sum(w * s.gpu_milli * s.num_gpu for s, w in zip(workload.shapes, workload.weights, strict=True))
        picked = [k for k, s in enumerate(workload.shapes) if s.num_gpu >= 2 and s.gpu_milli > 0]
        shapes = [workload.shapes[k] for k in picked]
        levels = sorted({s.gpu_milli for s in shapes})
        return cls(
            index=np.array(picked, dtype=np.int64),
            gpus=np.array([s.num_gpu for s in shapes], dtype=np.int64),
            cpu=np.array([s.cpu_milli for s in shapes], dtype=np.int64),
            volume_share=np.array(
                [workload.weights[k] * s.gpu_milli * s.num_gpu / volume if volume > 0 else 0.0 for k, s in zip(picked, shapes, strict=True)],
                dtype=np.float64,
            ),
            levels=np.array(levels, dtype=np.int64),
            level=np.array([levels.index(s.gpu_milli) for s in shapes], dtype=np.int64),
        )

    @property
    def milli(self) -> IntArray:
        result: IntArray = self.levels[self.level]
        return result

    def counts(self, free: IntArray) -> IntArray:
        """(K, U): per node, its GPUs with at least each level free."""
        result: IntArray = (free[:, :, None] >= self.levels[None, None, :]).sum(axis=1)
        return result

    def hosts(self, counts: IntArray, cpu_free: IntArray, model_ok: BoolArray) -> IntArray:
        """(K, L): how many pods of each shape each node can still take at once, GPUs and CPU together."""
        by_gpu = counts[:, self.level] // self.gpus[None, :]
        by_cpu = np.maximum(cpu_free, 0)[:, None] // np.maximum(self.cpu, 1)[None, :]
        result: IntArray = np.where(model_ok[:, self.index], np.minimum(by_gpu, np.where(self.cpu > 0, by_cpu, by_gpu)), 0)
        return result


def lump_pressure(lumps: LumpShapes, *, hosts: IntArray, free_milli: float) -> FloatArray:
    """Per multi-GPU shape: the chance that its pods still to come outnumber the spots left for them.

    Of the GPU still free, the shape's pods will ask its share of the workload's volume: on average
    mu = share x free / (its GPUs) pods, drawn independently, so their number is about Poisson(mu).
    The cluster has S spots for it (`hosts` summed over nodes). A spot taken from the shape is a pod
    of it refused when N >= S: P(N >= S), here by the normal approximation (continuity-corrected).
    It is near 0 while the shape has room to spare (a spot lost then costs nothing: another serves)
    and near 1 once it is short. 0 where no spot is left (nothing to lose).
    """
    spots = hosts.sum(axis=0)
    coming = lumps.volume_share * free_milli / (lumps.gpus * lumps.milli)
    z = (coming - spots + 0.5) / np.sqrt(np.maximum(coming, 1.0))
    tail = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2.0)) for v in z], dtype=np.float64)
    result: FloatArray = np.where(spots > 0, tail, 0.0)
    return result


def _ratios_for(workload: TargetWorkload, params: FGPUParams) -> ResourceRatios:
    """The target workload's ratios, unless the parameters pin them."""
    cpu = params.cpu_per_gpu_milli
    memory = params.memory_per_gpu_milli
    return ResourceRatios(
        cpu=workload.cpu_per_gpu_milli if cpu is None else float(cpu),
        memory=workload.memory_per_gpu_milli if memory is None else float(memory),
    )


class FGPUPolicy(FGDPolicy):
    name = "fgpu"

    def __init__(self, context: PolicyContext, params: FGPUParams, *, workload: TargetWorkload | None) -> None:
        super().__init__(context, workload=workload)
        self.params = params
        self.ratios = _ratios_for(self.index.workload, params)
        self.hole_weight = params.hole_weight
        self._set_lookahead(self.index.workload)
        self.holes = HoleWaste(self.index.workload, fill_supply=params.fill_supply, temperature=params.fill_temperature)
        self._pressure: FloatArray | None = None  # per model id of the state; None = to be recomputed

    def workload_changed(self, workload: TargetWorkload) -> None:
        super().workload_changed(workload)
        self.ratios = _ratios_for(workload, self.params)
        self.holes = HoleWaste(workload, fill_supply=self.holes.fill_supply, temperature=self.holes.temperature)
        self._pressure = None
        self._set_lookahead(workload)

    def _set_lookahead(self, workload: TargetWorkload) -> None:
        self.lumps = LumpShapes.of(workload)
        single = single_gpu_volume(workload)
        self.strand_weight = self.params.strand_weight * single
        self.hole_waste_weight = self.params.hole_weight * single

    def state_resized(self) -> None:
        super().state_resized()
        self._pressure = None

    def pressure(self) -> FloatArray:
        """`model_pressure` per model id of the cluster state, from the GPUs it holds now."""
        if self._pressure is None:
            state = self.state
            rows = state.active_slots()
            ids = state.model_id[rows][state.gpu_usable[rows] & (state.model_id[rows] >= 0)]
            counts = np.bincount(ids, minlength=len(state.models))
            by_model = {model: int(counts[i]) for i, model in enumerate(state.models)}
            pressure = model_pressure(self.index.workload, by_model)
            self._pressure = np.array([pressure[m] for m in state.models] + [0.0], dtype=np.float64)
        return self._pressure

    def dynamic(self, rows: SlotArray, demand: Demand, delta: FloatArray) -> FloatArray:
        # Not cached with the node deltas: those are shared by demands that differ only in their
        # models, and the scarcity of multi-GPU spots changes with every placement.
        if self.params.lump_weight and len(self.lumps.gpus):
            delta = delta + self.params.lump_weight * self.lump_deltas(rows, demand, width=delta.shape[1])
        if not self.hole_weight or not demand.gpus or not self.pressure().any():
            return delta  # no constrained shape in the workload: nothing to add (the common case)
        result: FloatArray = delta + self.hole_weight * self.model_deltas(rows, demand)[:, None]
        return result

    def lump_deltas(self, rows: SlotArray, demand: Demand, *, width: int) -> FloatArray:
        """GPU of multi-GPU pods expected to be refused for the spots the placement takes (milli): (K, width)."""
        self.tracker.refresh()
        index, lumps = self.index, self.lumps
        pressure = lump_pressure(
            lumps, hosts=lumps.hosts(lumps.counts(index.free), index.cpu_free, index.model_ok), free_milli=float(index.free.sum())
        )
        if not pressure.any():
            return np.zeros((len(rows), width))
        price = pressure * lumps.gpus * lumps.milli
        free, cpu, model_ok = index.free[rows], index.cpu_free[rows], index.model_ok[rows]
        counts = lumps.counts(free)
        cpu_after = cpu - demand.cpu_milli

        def value(fitting: IntArray, cpu_left: IntArray) -> FloatArray:
            # The GPU the node's spots are worth: the best of filling it with one shape (a lower
            # bound on the best mix; the max, not the sum, as one node's GPUs serve one shape or another).
            result: FloatArray = (lumps.hosts(fitting, cpu_left, model_ok) * price).max(axis=1)
            return result

        before = value(counts, cpu)
        if not (demand.is_share and demand.gpus == 1):
            milli = share_milli(demand) if demand.gpus else 0
            taken = index.exclusive_after(rows, gpu_milli=milli, num_gpu=demand.gpus)
            loss: FloatArray = (before - value(lumps.counts(taken), cpu_after))[:, None]
            return loss
        # A share takes its CPU wherever it goes, and one GPU: a shape loses that GPU only where the
        # share brings it below the shape's per-GPU request. Which requests it crosses, per GPU, as bits.
        milli = share_milli(demand)
        gpu_free = free[:, :width, None]
        crossed = (gpu_free >= lumps.levels[None, None, :]) & (gpu_free - milli < lumps.levels[None, None, :])
        pattern = crossed.astype(np.int64) @ (np.int64(1) << np.arange(len(lumps.levels), dtype=np.int64))
        after = np.empty(pattern.shape)
        for bits in np.unique(pattern):
            fewer = counts - ((int(bits) >> np.arange(len(lumps.levels))) & 1)[None, :]
            mine = pattern == bits
            after[mine] = np.broadcast_to(value(fewer, cpu_after)[:, None], pattern.shape)[mine]
        result: FloatArray = before[:, None] - after
        if result.shape[1] < width:
            result = np.pad(result, ((0, 0), (0, width - result.shape[1])))
        return result

    def model_deltas(self, rows: SlotArray, demand: Demand) -> FloatArray:
        """Constrained pods' expected need of the GPU this pod takes, beyond that of the least needed model it may use (milli)."""
        if not demand.gpus:
            return np.zeros(len(rows))
        pressure = self.pressure()
        state = self.state
        if not pressure.any():
            return np.zeros(len(rows))
        allowed = [state.model_ids[m] for m in demand.model_use if m in state.model_ids] or range(len(state.models))
        floor = min(float(pressure[i]) for i in allowed)
        need = pressure[state.model_id[rows, 0]] - floor  # model id -1 (unknown) reads the trailing 0
        result: FloatArray = np.maximum(need, 0.0) * share_milli(demand) * demand.gpus
        return result

    def stranded(self, idle: FloatArray, cpu_free: FloatArray, memory_free: FloatArray) -> FloatArray:
        """GPU (milli) that the node's CPU or memory can't feed, per node; untracked resources are +inf."""
        worst = np.zeros_like(idle)
        if self.ratios.cpu > 0:
            worst = np.maximum(worst, idle - cpu_free / self.ratios.cpu)
        if self.ratios.memory > 0:
            worst = np.maximum(worst, idle - memory_free / self.ratios.memory)
        return worst

    def deltas(self, rows: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        fragment = super().deltas(rows, demand, fits)
        if self.hole_waste_weight:
            fragment = fragment + self.hole_waste_weight * self.hole_deltas(rows, demand, wide=fragment.shape[1] > 1)
        if not self.strand_weight:
            return fragment
        return fragment + self.strand_weight * self.strand_deltas(rows, demand)[:, None]

    def hole_deltas(self, rows: SlotArray, demand: Demand, *, wide: bool) -> FloatArray:
        """Change of the expected eventual waste of the node's holes: (K, G) for a share, else (K, 1)."""
        index = self.index
        free = index.free[rows]
        # Every shape counts as a filler whatever the node's model (see the module docstring).
        model_ok = np.ones((len(rows), len(index.workload.shapes)), dtype=np.bool_)
        cpu = index.cpu_free[rows]
        before = self.holes.table_ids(model_ok=model_ok, cpu_free=cpu)
        after = self.holes.table_ids(model_ok=model_ok, cpu_free=cpu - demand.cpu_milli) if demand.cpu_milli else before
        if wide:
            return self.holes.sharing_deltas(
                free=free, ids_before=before, ids_after=after, gpu_milli=share_milli(demand)
            )
        milli = share_milli(demand) if demand.gpus else 0
        taken = index.exclusive_after(rows, gpu_milli=milli, num_gpu=demand.gpus)
        change = self.holes.node_waste(taken, after) - self.holes.node_waste(free, before)
        return change[:, None]

    def strand_deltas(self, rows: SlotArray, demand: Demand) -> FloatArray:
        """Change of the node's stranded GPU (milli), per node."""
        state = self.state
        idle = self.index.free[rows].sum(axis=1).astype(np.float64)
        cpu = np.where(state.cpu_alloc[rows] > 0, state.cpu_free[rows], np.inf)
        memory = np.where(state.host_mem_alloc[rows] > 0, state.host_mem_free[rows], np.inf)
        used = share_milli(demand) * demand.gpus if demand.gpus else 0
        before = self.stranded(idle, cpu, memory)
        after = self.stranded(idle - used, cpu - demand.cpu_milli, memory - demand.host_memory_bytes)
        result: FloatArray = after - before
        return result


register_policy(
    "fgpu",
    lambda context, params, options: FGPUPolicy(context, params, workload=options.workload),
    params=FGPUParams,
    options=FragmentationOptions,
    score=(
        "as fgd, with Δ = Δfrag + strand_weight x Δstranded + hole_weight x (Δhole-waste + GPU that model-constrained"
        " pods need) + lump_weight x multi-GPU spots taken, priced by their scarcity"
    ),
    share_gpu="as fgd",
)
