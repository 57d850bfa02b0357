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

Parameters: `strand_weight` (default 3), `hole_weight` (15), `fill_temperature` (30 milli-GPU: how
sharply arriving pods prefer the holes they fill best, 0 = they take the first hole they fit),
`fill_supply` (0.02: holes that only rare shapes fit are filled with probability (their frequency)
/ fill_supply, 0 = always), `cpu_per_gpu_milli` and `memory_per_gpu_milli` to pin the ratios
(0 leaves that resource out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from scheduler_plugin.core.demand import Demand, share_milli
from scheduler_plugin.core.fragmentation import FloatArray, HoleWaste, TargetWorkload
from scheduler_plugin.core.policies import BoolMatrix, PolicyContext, SlotArray, register_policy
from scheduler_plugin.core.policy_fgd import FGDPolicy

PARAMS = (
    "strand_weight",
    "hole_weight",
    "fill_temperature",
    "fill_supply",
    "cpu_per_gpu_milli",
    "memory_per_gpu_milli",
)
DEFAULT_STRAND_WEIGHT = 3.0
DEFAULT_HOLE_WEIGHT = 15.0
#: milli-GPU of eventual waste over which a pod's preference between two holes fades (see `HoleWaste`)
DEFAULT_FILL_TEMPERATURE = 30.0
#: frequency of fitting shapes at which a hole is sure to be filled (see `HoleWaste`)
DEFAULT_FILL_SUPPLY = 0.02


def _check_params(params: Mapping[str, float]) -> None:
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise ValueError(f"policy 'fgpu': unknown parameter(s) {', '.join(unknown)}; known: {', '.join(PARAMS)}")
    for key, value in params.items():
        if not float(value) >= 0:
            raise ValueError(f"policy 'fgpu': {key}={value!r} must be a number >= 0")


@dataclass(frozen=True)
class ResourceRatios:
    """CPU milli and host-memory bytes the workload's GPU pods ask per milli-GPU (0 = not tracked)."""

    cpu: float
    memory: float


def _ratios_for(workload: TargetWorkload, params: Mapping[str, float]) -> ResourceRatios:
    """The target workload's ratios, unless the parameters pin them."""
    cpu = params.get("cpu_per_gpu_milli")
    memory = params.get("memory_per_gpu_milli")
    return ResourceRatios(
        cpu=workload.cpu_per_gpu_milli if cpu is None else float(cpu),
        memory=workload.memory_per_gpu_milli if memory is None else float(memory),
    )


class FGPUPolicy(FGDPolicy):
    name = "fgpu"

    def __init__(self, context: PolicyContext) -> None:
        _check_params(context.params)
        super().__init__(context)
        self.ratios = _ratios_for(self.index.workload, context.params)
        self.strand_weight = float(context.params.get("strand_weight", DEFAULT_STRAND_WEIGHT))
        self.hole_weight = float(context.params.get("hole_weight", DEFAULT_HOLE_WEIGHT))
        fill_supply = float(context.params.get("fill_supply", DEFAULT_FILL_SUPPLY))
        temperature = float(context.params.get("fill_temperature", DEFAULT_FILL_TEMPERATURE))
        self.holes = HoleWaste(self.index.workload, fill_supply=fill_supply, temperature=temperature)

    def workload_changed(self, workload: TargetWorkload) -> None:
        super().workload_changed(workload)
        self.ratios = _ratios_for(workload, self.context.params)
        self.holes = HoleWaste(workload, fill_supply=self.holes.fill_supply, temperature=self.holes.temperature)

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
        if self.hole_weight:
            fragment = fragment + self.hole_weight * self.hole_deltas(rows, demand, wide=fragment.shape[1] > 1)
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


register_policy("fgpu", FGPUPolicy)
