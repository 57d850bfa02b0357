"""The `binpack` and `spread` policies: score a node by how full the pod leaves it.

As kube-scheduler's MostAllocated / LeastAllocated: per resource the share of
the node's capacity in use after the pod lands, averaged with weights over the
resources the node has (a node without GPUs is scored on CPU and memory only).
binpack prefers the fullest result, spread the emptiest. On a node, binpack
puts a share on the GPU it leaves fullest, spread on the one it leaves emptiest.

Weights (params): weight_gpu_core, weight_gpu_memory, weight_cpu, weight_memory;
each defaults to 1. A weight of 0 leaves that resource out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import numpy as np

from scheduler_plugin.core.demand import Demand
from scheduler_plugin.core.policies import (
    MAX_SCORE,
    BasePolicy,
    BoolMatrix,
    FloatArray,
    PolicyContext,
    SlotArray,
    loosest_gpus,
    register_policy,
    tightest_gpus,
)
from scheduler_plugin.core.settings import NoOptions, Param


@dataclass(frozen=True)
class UtilizationParams:
    """The weight of each resource in a node's share in use; 0 leaves a resource out."""

    weight_gpu_core: Annotated[float, Param("weight of GPU compute in the node's share in use")] = 1.0
    weight_gpu_memory: Annotated[float, Param("weight of GPU memory")] = 1.0
    weight_cpu: Annotated[float, Param("weight of CPU")] = 1.0
    weight_memory: Annotated[float, Param("weight of host memory")] = 1.0

    def __post_init__(self) -> None:
        if self.weight_gpu_core + self.weight_gpu_memory + self.weight_cpu + self.weight_memory == 0:
            raise ValueError("all weights are 0; give at least one resource a weight > 0")


class UtilizationPolicy(BasePolicy):
    """binpack (`most=True`) or spread (`most=False`)."""

    def __init__(self, context: PolicyContext, params: UtilizationParams, *, most: bool) -> None:
        super().__init__(context)
        self.most = most
        self.name = "binpack" if most else "spread"
        self.params = params
        self.weights = (params.weight_gpu_core, params.weight_gpu_memory, params.weight_cpu, params.weight_memory)

    def used_after(self, nodes: SlotArray, demand: Demand) -> FloatArray:
        """Weighted share of capacity in use after placing the demand, 0..1, per node."""
        state = self.state
        w_core, w_mem, w_cpu, w_host = self.weights
        numerator = np.zeros(len(nodes), dtype=np.float64)
        denominator = np.zeros(len(nodes), dtype=np.float64)
        cards = demand.gpus
        if w_core or w_mem:
            core_total = state.node_core_total[nodes]
            mem_total = state.node_mem_total[nodes]
            has_gpu = core_total > 0
            safe_core = np.maximum(core_total, 1)
            safe_mem = np.maximum(mem_total, 1)
            core_used = core_total - state.node_core_free[nodes] + demand.core_need() * cards
            if cards:
                mem_need = demand.memory_need(state.node_mem_max[nodes]) * cards
            else:
                mem_need = np.zeros(len(nodes), dtype=np.int64)
            mem_used = mem_total - state.node_mem_free[nodes] + mem_need
            numerator += np.where(has_gpu, w_core * core_used / safe_core + w_mem * mem_used / safe_mem, 0.0)
            denominator += np.where(has_gpu, w_core + w_mem, 0.0)
        if w_cpu:
            cpu_total = state.cpu_alloc[nodes]
            tracked = cpu_total > 0
            cpu_used = cpu_total - state.cpu_free[nodes] + demand.cpu_milli
            numerator += np.where(tracked, w_cpu * cpu_used / np.maximum(cpu_total, 1), 0.0)
            denominator += np.where(tracked, w_cpu, 0.0)
        if w_host:
            host_total = state.host_mem_alloc[nodes]
            tracked = host_total > 0
            host_used = host_total - state.host_mem_free[nodes] + demand.host_memory_bytes
            numerator += np.where(tracked, w_host * host_used / np.maximum(host_total, 1), 0.0)
            denominator += np.where(tracked, w_host, 0.0)
        share: FloatArray = np.clip(numerator / np.maximum(denominator, 1e-12), 0.0, 1.0)
        return share

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        used = self.used_after(nodes, demand)
        result: FloatArray = MAX_SCORE * (used if self.most else 1.0 - used)
        return result

    def choose_share_gpus(self, node: int, demand: Demand, fitting: SlotArray) -> Sequence[int]:
        if self.most:
            return tightest_gpus(self.state, node, demand, fitting)
        return loosest_gpus(self.state, node, demand, fitting)


_NOTES = "0 leaves a resource out; not all may be 0"
register_policy(
    "binpack",
    lambda context, params, options: UtilizationPolicy(context, params, most=True),
    params=UtilizationParams,
    options=NoOptions,
    score="weighted share of the node's GPU core, GPU memory, CPU and memory in use after the pod lands "
    "(kube-scheduler's MostAllocated): the fullest node",
    share_gpu="tightest",
    notes=_NOTES,
)
register_policy(
    "spread",
    lambda context, params, options: UtilizationPolicy(context, params, most=False),
    params=UtilizationParams,
    options=NoOptions,
    score="100 minus binpack's score (kube-scheduler's LeastAllocated): the emptiest node",
    share_gpu="loosest",
    notes=_NOTES,
)
