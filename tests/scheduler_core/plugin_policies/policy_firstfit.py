"""The `firstfit` policy, a walkthrough of adding a policy: this module is the whole change.

Every feasible node gets the same score, `level`, so the core's fixed node order decides (first fit),
and a share goes to the tightest GPU (`BasePolicy`). It declares one parameter, an integer in
0..100, which the service's config checks from this declaration alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np

from scheduler_plugin.core.demand import Demand
from scheduler_plugin.core.policies import (
    BasePolicy,
    BoolMatrix,
    FloatArray,
    PolicyContext,
    SlotArray,
    register_policy,
)
from scheduler_plugin.core.settings import NoOptions, Param


@dataclass(frozen=True)
class FirstFitParams:
    level: Annotated[int, Param("the score every feasible node gets", maximum=100)] = 50


class FirstFitPolicy(BasePolicy):
    name = "firstfit"

    def __init__(self, context: PolicyContext, params: FirstFitParams) -> None:
        super().__init__(context)
        self.level = float(params.level)

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        return np.full(len(nodes), self.level, dtype=np.float64)


register_policy(
    "firstfit",
    lambda context, params, options: FirstFitPolicy(context, params),
    params=FirstFitParams,
    options=NoOptions,
    score="`level` for every node, so the core's node order decides: the first node that fits",
    share_gpu="tightest",
)
