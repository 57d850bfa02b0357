"""What one pod needs, normalised once per decision so filter, score and GPU choice agree.

A `Demand` is built from a `PodRequest` by the core and handed to policies. It
answers the one question whose answer depends on the GPU: how much memory a
card takes when the pod gave a ratio ("50% of whatever GPU it lands on").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from apis.mig import MIGMode
from apis.overcommit import Burst
from scheduler_plugin.core.api import PodRequest
from scheduler_plugin.core.fragmentation import MILLI

#: Percent values of one GPU: 100 is the whole card.
FULL_PERCENT = 100


@dataclass(frozen=True)
class Demand:
    """A pod's need in the core's units.

    `gpus` is 0 for a pod without GPUs. For a share (`whole` False) every card
    needs `core_percent` free compute and its memory free on a distinct GPU;
    for `whole` every card must be entirely free.
    """

    gpus: int
    core_percent: int
    #: per card, when the pod gave bytes
    memory_bytes: int | None
    #: per card, when the pod gave a ratio of the GPU's memory
    memory_ratio_percent: int | None
    whole: bool
    cpu_milli: int = 0
    host_memory_bytes: int = 0
    #: label-safe GPU models the pod may use; empty = any (what a learnt target workload records)
    model_use: frozenset[str] = frozenset()
    #: the pod's `fgpu.io/gpu-mode` (apis/mig.py): MIG instances only, never MIG, or either
    mig_mode: MIGMode = MIGMode.ANY
    #: a burstable share's limits (apis/overcommit.py, core/overcommit.py); None for a guaranteed one
    burst: Burst | None = None

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0

    @property
    def is_share(self) -> bool:
        """A fractional request: part of each card (the case policies choose GPUs for)."""
        return self.gpus > 0 and not self.whole

    @property
    def mig_eligible(self) -> bool:
        """A MIG instance may serve it: a single-card share whose pod did not say `shared`."""
        return self.gpus == 1 and not self.whole and self.mig_mode is not MIGMode.SHARED and self.burst is None

    @property
    def mig_only(self) -> bool:
        """Only a MIG instance may serve it (`fgpu.io/gpu-mode: mig`), never a share of a regular GPU."""
        return self.mig_mode is MIGMode.MIG and self.mig_eligible

    def memory_need(self, memory_total: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Bytes one card takes on GPUs of the given sizes (any array shape)."""
        if self.whole:
            return memory_total
        if self.memory_bytes is not None:
            return np.full_like(memory_total, self.memory_bytes)
        if self.memory_ratio_percent is not None:
            # Rounded down as DeviceRequest.memory_bytes_on does, so shares whose
            # ratios sum to 100 always fit together.
            return (memory_total * self.memory_ratio_percent) // FULL_PERCENT
        return np.zeros_like(memory_total)

    def memory_need_on(self, memory_total: int) -> int:
        """`memory_need` for a single GPU."""
        if self.whole:
            return memory_total
        if self.memory_bytes is not None:
            return self.memory_bytes
        if self.memory_ratio_percent is not None:
            return (memory_total * self.memory_ratio_percent) // FULL_PERCENT
        return 0

    def core_need(self) -> int:
        return FULL_PERCENT if self.whole else self.core_percent


def share_milli(demand: Demand) -> int:
    """Per-card request in milli-GPU: the larger of its compute and memory-ratio parts."""
    if demand.whole:
        return MILLI
    percent = max(demand.core_percent, demand.memory_ratio_percent or 0)
    return min(MILLI, percent * MILLI // FULL_PERCENT)


def demand_of(pod: PodRequest) -> Demand:
    """The Demand of a parsed pod."""
    device = pod.device
    if device is None:
        return Demand(
            gpus=0,
            core_percent=0,
            memory_bytes=None,
            memory_ratio_percent=None,
            whole=False,
            cpu_milli=pod.cpu_milli,
            host_memory_bytes=pod.memory_bytes,
            model_use=pod.model_use,
        )
    return Demand(
        gpus=device.gpus,
        core_percent=FULL_PERCENT if device.whole else device.core_percent,
        memory_bytes=None if device.whole else device.memory_bytes,
        memory_ratio_percent=FULL_PERCENT if device.whole else device.memory_ratio_percent,
        whole=device.whole,
        cpu_milli=pod.cpu_milli,
        host_memory_bytes=pod.memory_bytes,
        model_use=pod.model_use,
        mig_mode=pod.mig_mode,
        burst=device.limit,
    )
