"""Baseline policies from the FGD paper's comparison, so its published numbers can be reproduced.

* `random`: every feasible node equally likely; a share goes to a uniformly drawn fitting GPU.
* `bestfit`: score = int((1 - [0.5*(cpuFree-cpuReq)/128000 + 0.5*(gpuFreeTotal-gpuReq)/8000]) * 100),
  memory ignored; a share goes to the tightest GPU that fits (lowest index on ties).
* `dotprod` (Tetris-style alignment): score = int(100 * (1 - <free, request> / 2)) with CPU and
  GPU each normalised by the largest node spec (128 cores, 8 GPUs), so the node whose leftover
  lines up least with the pod wins (packing); a share goes to the tightest GPU.

128 cores and 8 GPUs are the paper's normalisers (its largest node); bigger nodes clip at 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduler_plugin.core.demand import Demand, share_milli
from scheduler_plugin.core.policies import (
    MAX_SCORE,
    BasePolicy,
    BoolMatrix,
    FloatArray,
    PolicyContext,
    SlotArray,
    register_policy,
)
from scheduler_plugin.core.policy_fgd import free_milli
from scheduler_plugin.core.settings import NoOptions, NoParams

#: the normalisers of the paper's simulator: its largest node spec
MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000
#: CPU that untracked nodes are treated as having free
_UNTRACKED_CPU = MAX_SPEC_CPU_MILLI


def _cpu_free(policy: BasePolicy, nodes: SlotArray) -> FloatArray:
    state = policy.state
    result: FloatArray = np.where(state.cpu_alloc[nodes] > 0, state.cpu_free[nodes], _UNTRACKED_CPU).astype(
        np.float64
    )
    return result


def _requested_milli(demand: Demand) -> int:
    return share_milli(demand) * demand.gpus if demand.gpus else 0


class RandomPolicy(BasePolicy):
    name = "random"

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self.rng = np.random.default_rng(context.seed)

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        # Distinct random reals: the top one is uniform over the nodes, and never tied.
        result: FloatArray = self.rng.random(len(nodes)) * MAX_SCORE
        return result

    def choose_share_gpus(self, node: int, demand: Demand, fitting: SlotArray) -> Sequence[int]:
        picked = self.rng.choice(fitting, size=demand.gpus, replace=False)
        return sorted(int(g) for g in picked)


class BestFitPolicy(BasePolicy):
    name = "bestfit"

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        cpu_left = _cpu_free(self, nodes) - demand.cpu_milli
        gpu_left = free_milli(self.state, nodes).sum(axis=1) - _requested_milli(demand)
        raw = (1.0 - (0.5 * cpu_left / MAX_SPEC_CPU_MILLI + 0.5 * gpu_left / MAX_SPEC_GPU_MILLI)) * MAX_SCORE
        result: FloatArray = np.clip(np.trunc(raw), 0.0, MAX_SCORE)
        return result


class DotProductPolicy(BasePolicy):
    name = "dotprod"

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        cpu = _cpu_free(self, nodes) / MAX_SPEC_CPU_MILLI * (demand.cpu_milli / MAX_SPEC_CPU_MILLI)
        gpu_free = free_milli(self.state, nodes).sum(axis=1)
        gpu = gpu_free / MAX_SPEC_GPU_MILLI * (_requested_milli(demand) / MAX_SPEC_GPU_MILLI)
        result: FloatArray = np.clip(np.trunc((1.0 - (cpu + gpu) / 2.0) * MAX_SCORE), 0.0, MAX_SCORE)
        return result


register_policy(
    "random",
    lambda context, params, options: RandomPolicy(context),
    params=NoParams,
    options=NoOptions,
    score="uniform over the feasible nodes (drawn with the run's seed)",
    share_gpu="uniform fitting GPU",
)
register_policy(
    "bestfit",
    lambda context, params, options: BestFitPolicy(context),
    params=NoParams,
    options=NoOptions,
    score="`int((1 - [0.5*(cpuFree-cpuReq)/128000 + 0.5*(gpuFree-gpuReq)/8000]) * 100)`, memory ignored",
    share_gpu="tightest",
)
register_policy(
    "dotprod",
    lambda context, params, options: DotProductPolicy(context),
    params=NoParams,
    options=NoOptions,
    score="Tetris alignment of free (CPU, GPU) with the request, normalised by 128 cores / 8 GPUs",
    share_gpu="tightest",
)
