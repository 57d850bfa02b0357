"""The burstable tier's scheduling rule, per GPU (docs/overcommit.md).

Requests are counted as for every share (`core_free`, `mem_free`), so a burstable pod's request
is reserved like a guaranteed one's and guaranteed pods never count on borrowed capacity. On top
of that, a burstable pod lands on a GPU only when, with it, the burstable *limits* on the GPU stay
within the node pool's ratio times what the guaranteed shares leave:

    sum(burstable limits) <= ratio x (capacity - sum(guaranteed requests))

for compute and for memory alike. The ratio is the node's `fgpu.io/burstable-ratio` label (its
node pool's setting, as the pool's agent config says; docs/overcommit.md); a node without it, or
with a value that is not a number >= 1, takes no burstable share. A node whose isolation backend
is `none` must not carry the label: its agent refuses burstable containers anyway.

The rule is checked when a burstable pod is placed. A guaranteed pod placed later counts only its
request, as always: the burstable pods on the GPU then carry the risk, and the node's reclaim
(agent/reclaim.py) evicts them when the memory is really needed.

Pure: arrays in, arrays out; `write_row` fills a node's columns from its records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from apis import names
from apis.allocation import Allocation, GPUShare, ShareLimit
from apis.devices import GPUInfo
from apis.overcommit import Burst
from scheduler_plugin.core.demand import FULL_PERCENT, Demand

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: The ratio is kept in thousandths, so the arrays stay integers.
RATIO_SCALE = 1000
#: No pool may promise more than this many times what its guaranteed shares leave.
MAX_RATIO = 10


def ratio_of(labels: Mapping[str, str]) -> int:
    """The node's ratio in thousandths; 0 (no burstable share) when the label is absent or invalid."""
    raw = labels.get(names.NODE_BURSTABLE_RATIO)
    problem = ratio_problem(raw) if raw is not None else "absent"
    if raw is None or problem:
        return 0
    return int(Fraction(raw.strip()) * RATIO_SCALE)


def ratio_problem(raw: str) -> str:
    """Why `raw` is no valid ratio, or "" when it is one (a number from 1 to MAX_RATIO)."""
    try:
        value = Fraction(raw.strip())
    except (ValueError, ZeroDivisionError):
        return f"{raw!r} is not a number; write e.g. 1.5"
    if not 1 <= value <= MAX_RATIO:
        return f"{raw!r} must be between 1 (limits within what guaranteed shares leave) and {MAX_RATIO}"
    return ""


def gpu_columns(
    allocations: Sequence[Allocation], slot_for: Callable[[GPUShare], int | None], gpus: Sequence[GPUInfo]
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per GPU slot: guaranteed core and memory requested, burstable core and memory limits."""
    count = len(gpus)
    g_core, g_mem, b_core, b_mem = [0] * count, [0] * count, [0] * count, [0] * count
    for allocation in allocations:
        for share in allocation.gpus:
            if share.mig_uuid or share.mig_profile:
                continue
            slot = slot_for(share)
            if slot is None:
                continue
            size = gpus[slot].memory_bytes
            if share.limit is None:
                g_core[slot] += share.core_percent
                g_mem[slot] += _share_bytes(share, size)
            else:
                # Clamped to the card as the node's hook clamps it (agent/isolation/burst.py): a limit
                # above the card cannot use more than the card, and unclamped sums of limits near 2**62
                # (allocations signed before apis/overcommit.py bounded them) leave the int64 columns.
                b_core[slot] += min(share.limit.core_percent, FULL_PERCENT)
                limit = share.limit.memory_bytes or size * share.limit.memory_ratio_percent // FULL_PERCENT
                b_mem[slot] += min(limit, size)
    return g_core, g_mem, b_core, b_mem


def _share_bytes(share: GPUShare, size: int) -> int:
    if share.memory_bytes:
        return share.memory_bytes
    if share.memory_ratio_percent:
        return size * share.memory_ratio_percent // FULL_PERCENT
    return size if share.core_percent == FULL_PERCENT else 0


def burst_fits(
    demand: Demand,
    *,
    ratio: Int64Array,
    mem_total: Int64Array,
    guaranteed_core: Int64Array,
    guaranteed_mem: Int64Array,
    burst_core: Int64Array,
    burst_mem: Int64Array,
) -> BoolArray:
    """fits[i, g]: GPU g of row i may take the burstable `demand` (its limits) under the rule.

    `ratio` is per row (thousandths); the others are per row and GPU. A guaranteed demand fits
    everywhere (this rule does not apply to it).
    """
    burst = demand.burst
    if burst is None:
        return np.ones_like(mem_total, dtype=np.bool_)
    # Every term is at most a card (limits clamped here and in gpu_columns), so no sum leaves int64. The
    # ratio divides the room rather than multiplying the limits: for integers a, a*S <= X iff a <= X // S.
    limit_mem = np.maximum(burst_memory_need(burst, mem_total), np.minimum(demand.memory_need(mem_total), mem_total))
    scale = ratio[:, None]
    core_room = (scale * (FULL_PERCENT - guaranteed_core)) // RATIO_SCALE
    mem_room = (scale * (mem_total - guaranteed_mem)) // RATIO_SCALE
    core_ok = burst_core + min(burst.core_percent, FULL_PERCENT) <= core_room
    mem_ok = burst_mem + limit_mem <= mem_room
    result: BoolArray = (scale > 0) & core_ok & mem_ok
    return result


def burst_memory_need(burst: Burst, mem_total: Int64Array) -> Int64Array:
    """The burstable memory limit on GPUs of the given sizes, clamped to each card."""
    if burst.memory_bytes is not None:
        # Compared as a Python int first: a limit past int64 would not fit into the array.
        return np.minimum(mem_total, min(burst.memory_bytes, int(mem_total.max(initial=0))))
    return (mem_total * min(burst.memory_ratio_percent or 0, FULL_PERCENT)) // FULL_PERCENT


def share_limit(burst: Burst | None, *, gpu_memory_bytes: int, memory_bytes: int, memory_ratio: int) -> ShareLimit | None:
    """The limit the scheduler signs into a burstable share on a GPU of `gpu_memory_bytes` (None: guaranteed)."""
    if burst is None:
        return None
    # Clamped to the card, as the hook clamps it: more than the card is the card.
    limit_bytes = max(min(burst.memory_bytes_on(gpu_memory_bytes), gpu_memory_bytes), memory_bytes)
    ratio = burst.memory_ratio_percent
    if ratio is None:
        ratio = min(FULL_PERCENT, -((-limit_bytes * FULL_PERCENT) // max(gpu_memory_bytes, 1)))
    return ShareLimit(core_percent=min(burst.core_percent, FULL_PERCENT), memory_bytes=limit_bytes,
                      memory_ratio_percent=max(min(ratio, FULL_PERCENT), memory_ratio))


def refusal(demand: Demand, ratio_milli: int) -> str:
    """Words for a node that refuses a burstable pod by its ratio alone."""
    if demand.burst is None:
        return ""
    if ratio_milli <= 0:
        return (f"node takes no burstable GPU share (no valid {names.NODE_BURSTABLE_RATIO} label on the node: "
                "its pool does not allow overcommit)")
    return (f"no GPU here keeps the burstable limits within {ratio_milli / RATIO_SCALE:g} x what the guaranteed "
            "shares leave free")
