"""Which GPUs of the chosen node a pod gets.

* Shares go where the GPU-level policy says (binpack: the GPU left fullest).
  A single-card share that fits no regular GPU takes a MIG instance: a free one
  whose memory covers the request, else a new one whose profile and placement
  core/mig_placement.py chooses (the instance's own compute slices replace the
  requested core percent; MIG cannot split finer).
* Whole GPUs go to the best-connected free set: inside one NVLink group, else
  one PCIe root, else one NUMA node, else anywhere. Among groups that can hold
  the pod the fullest one wins, so big free groups stay whole. On boards with
  a partition table a free partition of the requested size is used when there
  is one, preferring partitions whose parent partition is already broken.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from apis.allocation import Allocation, GPUShare
from scheduler_plugin.core import mig_placement, overcommit
from scheduler_plugin.core.api import Code, SchedulingError, Status
from scheduler_plugin.core.demand import FULL_PERCENT, Demand
from scheduler_plugin.core.policies import Policy
from scheduler_plugin.core.records import NodeRecord
from scheduler_plugin.core.topology import NodeTopology

#: Tiers of connectedness, best first, and the scope that names each.
_TIERS = ("nvlink", "pcie", "numa")


def _ratio(memory: int, total: int) -> int:
    return min(FULL_PERCENT, -((-memory * FULL_PERCENT) // max(total, 1)))


def share_allocation(
    record: NodeRecord, demand: Demand, slots: Sequence[int], mem_total: Sequence[int]
) -> Allocation:
    shares = []
    for slot in slots:
        gpu = record.gpus[slot]
        if demand.whole:
            shares.append(GPUShare(gpu.minor, gpu.uuid, FULL_PERCENT, gpu.memory_bytes, FULL_PERCENT))
            continue
        memory = demand.memory_need_on(int(mem_total[slot]))
        ratio = (
            demand.memory_ratio_percent
            if demand.memory_ratio_percent is not None
            else _ratio(memory, gpu.memory_bytes)
        )
        limit = overcommit.share_limit(demand.burst, gpu_memory_bytes=gpu.memory_bytes, memory_bytes=memory,
                                       memory_ratio=ratio)
        shares.append(GPUShare(gpu.minor, gpu.uuid, demand.core_percent, memory, ratio, limit=limit))
    return Allocation(gpus=tuple(shares))


def choose_shares(
    *,
    policy: Policy,
    node: int,
    demand: Demand,
    fitting: npt.NDArray[np.intp],
) -> list[int]:
    chosen = [int(s) for s in policy.choose_share_gpus(node, demand, fitting)]
    allowed = set(fitting.tolist())
    if len(chosen) != demand.gpus or len(set(chosen)) != len(chosen) or not set(chosen) <= allowed:
        raise SchedulingError(
            Status(
                Code.ERROR,
                (
                    f"policy {policy.name!r} chose GPU slots {chosen} for {demand.gpus} card(s); "
                    f"it must pick {demand.gpus} distinct slot(s) out of {sorted(allowed)}",
                ),
            )
        )
    return chosen


def mig_views(record: NodeRecord, eligible: Sequence[int]) -> list[mig_placement.GPUSlot]:
    """The node's MIG GPUs among the `eligible` slots that may give an instance (healthy, fgpu's), with what is held."""
    used = frozenset(record.used_migs())
    allocations = [pod.allocation for pod in record.pods.values() if pod.allocation]
    return [
        mig_placement.GPUSlot(slot, gpu, used, mig_placement.promised_on(gpu, allocations))
        for slot, gpu in enumerate(record.gpus)
        if slot in eligible and gpu.mig_enabled and gpu.healthy and gpu.uuid not in record.external
    ]


def choose_mig(record: NodeRecord, demand: Demand, eligible: Sequence[int]) -> Allocation | None:
    """A free MIG instance, or a new one at a chosen placement, on an eligible GPU slot (core/mig_placement.py)."""
    views = mig_views(record, eligible)
    choice = mig_placement.choose(views, [demand.memory_need_on(v.gpu.memory_bytes) for v in views])
    if choice is None:
        return None
    gpu = record.gpus[choice.slot]
    memory = choice.memory_bytes
    share = GPUShare(
        gpu.minor, gpu.uuid, demand.core_percent, memory, _ratio(memory, gpu.memory_bytes), choice.uuid,
        mig_profile="" if choice.uuid else choice.profile,
        mig_placement=-1 if choice.uuid else choice.placement_start,
    )
    return Allocation(gpus=(share,))


def choose_whole(topology: NodeTopology, free: Sequence[int], count: int, scope: str) -> list[int] | None:
    """`count` GPU slots out of `free` (all entirely free), or None when `scope` cannot be met."""
    free_set = set(free)
    if len(free_set) < count:
        return None
    partition = _choose_partition(topology, free_set, count, scope)
    if partition is not None:
        return partition
    tiers = _TIERS[_TIERS.index(scope) :] if scope in _TIERS else _TIERS
    if scope in _TIERS:
        # A required scope must hold on its own tier; finer tiers only refine inside it.
        chosen = _pick_in_tier(topology, sorted(free_set), count, scope, tiers[1:])
        return chosen
    return _pick(topology, sorted(free_set), count, tiers)


def _groups(topology: NodeTopology, tier: str) -> tuple[int, ...]:
    result: tuple[int, ...] = getattr(topology, tier)
    return result


def _pick(topology: NodeTopology, free: list[int], count: int, tiers: Sequence[str]) -> list[int]:
    for position, tier in enumerate(tiers):
        chosen = _pick_in_tier(topology, free, count, tier, tiers[position + 1 :])
        if chosen is not None:
            return chosen
    if topology.partitions:
        # Sizes the table lacks (3, 5, ...): take GPUs from the most broken partitions first.
        free_set = set(free)
        sizes = sorted(size for size in topology.partitions if size > 1)

        def pressure(slot: int) -> tuple[int, ...]:
            free_around = [
                sum(1 for s in next((p for p in topology.partitions[size] if slot in p), ()) if s in free_set)
                for size in sizes
            ]
            return (*free_around, slot)

        return sorted(free, key=pressure)[:count]
    return free[:count]


def _pick_in_tier(
    topology: NodeTopology, free: list[int], count: int, tier: str, finer: Sequence[str]
) -> list[int] | None:
    groups = _groups(topology, tier)
    members: dict[int, list[int]] = {}
    for slot in free:
        group = groups[slot] if slot < len(groups) else -1
        if group >= 0:
            members.setdefault(group, []).append(slot)
    candidates = [(len(slots), group) for group, slots in members.items() if len(slots) >= count]
    if not candidates:
        return None
    _, group = min(candidates)  # the fullest group that still fits keeps bigger free groups whole
    return _pick(topology, members[group], count, finer)


def _choose_partition(topology: NodeTopology, free: set[int], count: int, scope: str) -> list[int] | None:
    partitions = topology.partitions.get(count)
    if not partitions:
        return None
    candidates: list[tuple[int, ...]] = [
        p for p in partitions if free.issuperset(p) and _within_scope(topology, p, scope)
    ]
    if not candidates:
        return None
    larger = sorted(size for size in topology.partitions if size > count)

    def broken_parents(partition: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        # Free GPUs of each enclosing partition, smallest first: fewer means already broken.
        key = []
        for size in larger:
            parent = next((p for p in topology.partitions[size] if set(partition) <= set(p)), ())
            key.append(sum(1 for s in parent if s in free))
        return tuple(key), partition

    candidates.sort(key=broken_parents)
    return list(candidates[0])


def _within_scope(topology: NodeTopology, slots: Sequence[int], scope: str) -> bool:
    if scope not in _TIERS:
        return True
    groups = _groups(topology, scope)
    ids = {groups[s] for s in slots}
    return len(ids) == 1 and -1 not in ids
