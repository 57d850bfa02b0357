"""A memory-only share never shares a card with another pod's compute.

A share of GPU memory without compute (Koordinator's `gpu-memory` alone, HAMi's `gpumem`
without `gpucores`, Volcano's `vgpu-memory`, Aliyun's `gpu-mem`) reserves 0% of the card's
compute, and both isolation backends read 0% as *no limit*: HAMi-core's
`CUDA_DEVICE_SM_LIMIT=0`, MPS's active thread percentage left at 100. Counted as 0% it would fit
every card with memory left, and then take the compute the pods beside it reserved. So, per card
(docs/isolation.md):

* a memory-only share fits only a card where no other pod holds compute (its core is all free):
  it shares cards only with other memory-only shares;
* a share with compute fits only a card where no memory-only share sits.

Whole GPUs are exclusive already; MIG instances are isolated by the hardware, so neither rule
applies to them. The node's hook refuses the same mixes (agent/hook.py), whatever the scheduler
signed. A burstable share whose request has no compute but whose limit has some runs capped, so
it is not memory-only; holding no compute, it does not block one either.
"""

from __future__ import annotations

from collections.abc import Sequence

from apis import names
from apis.allocation import GPUShare
from scheduler_plugin.core.demand import Demand

#: GPUs named one by one in a reason.
_MAX_LISTED = 3


def is_memory_only(demand: Demand) -> bool:
    """A share that would run with no compute limit: 0% compute asked and none as a burst limit."""
    return demand.is_share and demand.core_percent == 0 and (demand.burst is None or demand.burst.core_percent == 0)


def share_is_memory_only(share: GPUShare) -> bool:
    """An allocated share of a regular GPU that runs with no compute limit."""
    return (
        not share.mig_uuid
        and not share.mig_profile
        and share.core_percent == 0
        and (share.limit is None or share.limit.core_percent == 0)
    )


def _listed(gpus: Sequence[str]) -> str:
    if len(gpus) > _MAX_LISTED:
        return ", ".join(gpus[:_MAX_LISTED]) + f" and {len(gpus) - _MAX_LISTED} more"
    return ", ".join(gpus)


def refusal(demand: Demand, need: str, blocked: Sequence[tuple[int, int]]) -> str:
    """Why the GPUs that would otherwise take the pod refuse it under the rule.

    `blocked`: (GPU index, compute percent other pods hold on it) for each such GPU, in index order.
    """
    if is_memory_only(demand):
        held = _listed([f"GPU {index}: {core}% core held" for index, core in blocked])
        return (
            f"{need} asks for GPU memory only, so it would run with no compute limit (backends read 0% as "
            f"no limit) and may share a card only with other memory-only shares; every GPU here with room "
            f"for it holds compute reserved by other pods ({held}); ask for a compute share too "
            f"({names.GPU_CORE}, or your vendor's core resource) to share a card with them"
        )
    cards = _listed([f"GPU {index}" for index, _ in blocked])
    return (
        f"the GPUs here with room for {need} ({cards}) hold another pod's memory-only share, which runs with no "
        "compute limit, so no compute share is placed beside it; wait for it to end, or have memory-only pods "
        f"ask for {names.GPU_CORE} too"
    )
