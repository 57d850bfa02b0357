"""Why a node cannot take a pod, in words a person acts on.

Called only for nodes the vectorised filter rejected. The checks run in the
order a person would look: does the node exist, do its labels match, do its
rules let the pod on (taints, cordon, conditions, host ports, max pods:
`noderules.py`), CPU and memory, then GPUs (report, model, count, health, free capacity, topology).
The first failing check is the reason; `unresolvable` says whether waiting
for other pods to leave could ever help.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from apis import names
from apis.mig import MIGMode
from apis.quantity import format_bytes
from scheduler_plugin.core import gpuchoice, memory_only, mig_placement, overcommit
from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import FULL_PERCENT, Demand
from scheduler_plugin.core.filtering import (
    SCOPE_GROUPS,
    BoolArray,
    Constraints,
    SlotArray,
    largest_group_count,
    rule_fits,
)
from scheduler_plugin.core.labels import LabelIndex, matches
from scheduler_plugin.core.noderules import refusal
from scheduler_plugin.core.records import NodeRecord

#: Unhealthy GPUs (and the pod's models, affinity values) named one by one in a reason before the
#: rest are counted: the pod's lists are its author's text, as long as an annotation allows.
_MAX_LISTED = 3
_SCOPE_WORDS = {"nvlink": "NVLink group", "pcie": "PCIe root", "numa": "NUMA node"}


@dataclass(frozen=True)
class Reason:
    text: str
    unresolvable: bool


def describe_demand(demand: Demand) -> str:
    """ "4 whole GPUs", "1 GPU share of 50% core and 20Gi", "2 GPU shares of 30% core and 50% memory each"."""
    if demand.whole:
        return f"{demand.gpus} whole GPU{'s' if demand.gpus != 1 else ''}"
    parts = []
    if demand.core_percent:
        parts.append(f"{demand.core_percent}% core")
    if demand.memory_bytes is not None:
        parts.append(memory_words(demand.memory_bytes))
    elif demand.memory_ratio_percent is not None:
        parts.append(f"{demand.memory_ratio_percent}% memory")
    what = " and ".join(parts) or "no core or memory"
    if demand.gpus == 1:
        return f"1 GPU share of {what}"
    return f"{demand.gpus} GPU shares of {what} each"


@functools.lru_cache(maxsize=4096)
def memory_words(n: int) -> str:
    """Bytes the way a person reads them: exact binary suffix when there is one, else GiB with 1 decimal."""
    exact = format_bytes(max(n, 0))
    if not exact.isdigit() or n < 2**30:
        return exact
    return f"{n / 2**30:.1f}Gi"


def explain(
    *,
    state: ClusterState,
    labels: LabelIndex,
    record: NodeRecord | None,
    slot: int,
    constraints: Constraints,
) -> Reason:
    demand = constraints.demand
    if record is None or not record.known:
        return Reason("node is not known to the fgpu scheduler (no Node object or Device report seen)", True)
    label_reason = _labels_reason(labels.labels_of(slot), constraints)
    if label_reason:
        return Reason(label_reason, True)
    rule = refusal(
        record.info.rules if record.info else None,
        constraints.pod.node_needs,
        pods_on_node=len(record.pods),
        ports_in_use=record.host_ports(),
    )
    if rule is not None:
        return Reason(rule.text, rule.unresolvable)
    cpu_alloc, cpu_free = int(state.cpu_alloc[slot]), int(state.cpu_free[slot])
    if demand.cpu_milli and cpu_alloc and cpu_free < demand.cpu_milli:
        # More than the node's allocatable can never fit, whatever leaves.
        text = f"insufficient cpu: {cpu_free}m free, pod needs {demand.cpu_milli}m"
        return Reason(text, demand.cpu_milli > cpu_alloc)
    mem_alloc, mem_free = int(state.host_mem_alloc[slot]), int(state.host_mem_free[slot])
    if demand.host_memory_bytes and mem_alloc and mem_free < demand.host_memory_bytes:
        need = memory_words(demand.host_memory_bytes)
        text = f"insufficient memory: {memory_words(mem_free)} free, pod needs {need}"
        return Reason(text, demand.host_memory_bytes > mem_alloc)
    if not demand.wants_gpu:
        return Reason("node fits the pod", False)  # not reached for rejected nodes
    return _gpu_reason(state, record, slot, constraints)


def listed(items: Sequence[str], most: int = _MAX_LISTED) -> str:
    """ "a, b, c and 4 more": at most `most` items named, the rest counted."""
    if len(items) <= most:
        return ", ".join(items)
    return ", ".join(items[:most]) + f" and {len(items) - most} more"


def _labels_reason(node_labels: Mapping[str, str], constraints: Constraints) -> str:
    pod = constraints.pod
    for key, value in pod.node_selector.items():
        have = node_labels.get(key)
        if have != value:
            has = f"has {key}={have}" if have is not None else f"has no label {key}"
            return f"node {has}, pod's nodeSelector needs {key}={value}"
    if pod.affinity_terms and not any(
        term and all(matches(node_labels, r) for r in term) for term in pod.affinity_terms
    ):
        unmet = [
            next(
                (f"{r.key} {r.operator} [{listed([repr(v) for v in r.values])}]" for r in term if not matches(node_labels, r)),
                "empty term",
            )
            for term in pod.affinity_terms
        ]
        return f"node matches none of the pod's required node affinity terms (unmet: {'; '.join(unmet)})"
    return ""


def _gpu_reason(state: ClusterState, record: NodeRecord, slot: int, constraints: Constraints) -> Reason:
    demand = constraints.demand
    pod = constraints.pod
    need = describe_demand(demand)
    devices = record.devices
    if devices is None:
        return Reason("node has no Device report (is the fgpu agent running there?)", True)
    if not record.gpus:
        if devices.discovery_error:
            return Reason(f"GPU discovery failed on the node: {devices.discovery_error}", True)
        return Reason("node has no GPUs", True)

    node_models = sorted({gpu.model_label for gpu in record.gpus})
    allowed = [gpu for gpu in record.gpus if constraints.allowed_models[state.model_index(gpu.model_label)]]
    if not allowed:
        have = ", ".join(node_models)
        if constraints.job_model is not None and constraints.job_model not in node_models:
            return Reason(f"job {pod.job_key} runs on model {constraints.job_model}; node has {have}", True)
        if pod.model_use and not set(node_models) & pod.model_use:
            return Reason(f"model {have} not in use list [{listed(sorted(pod.model_use))}]", True)
        return Reason(f"model {have} in avoid list [{listed(sorted(pod.model_avoid))}]", True)

    total = len(allowed)
    if total < demand.gpus:
        return Reason(f"node has {total} GPU{'s' if total != 1 else ''}, pod needs {need}", True)
    healthy = [gpu for gpu in allowed if gpu.healthy]
    if len(healthy) < demand.gpus:
        sick = [f"GPU {g.index}: {g.health_reason}" for g in allowed if not g.healthy and g.health_reason]
        if len(sick) > _MAX_LISTED:
            sick = [*sick[:_MAX_LISTED], f"{len(sick) - _MAX_LISTED} more"]
        detail = f" ({'; '.join(sick)})" if sick else ""
        return Reason(f"{len(healthy)} of {total} GPUs healthy, pod needs {need}{detail}", True)
    mig_ok = demand.mig_eligible and any(g.mig_enabled for g in healthy)
    if demand.mig_only and not mig_ok:
        return Reason(no_mig_gpu_words(need), True)
    usable = [gpu for gpu in healthy if record.usable(record.slot_by_uuid[gpu.uuid])]
    if len(usable) < demand.gpus and not mig_ok:
        held = sum(1 for g in healthy if g.uuid in record.external)
        mig = sum(1 for g in healthy if g.mig_enabled)
        why = ", ".join(
            part
            for part in (
                f"{held} held outside fgpu" if held else "",
                f"{mig} in MIG mode" if mig else "",
                f"the pod's {names.GPU_MODE}=shared refuses MIG instances"
                if mig and demand.mig_mode is MIGMode.SHARED and demand.is_share and demand.gpus == 1
                else "",
            )
            if part
        )
        return Reason(
            f"{len(usable)} of {len(healthy)} healthy GPUs usable ({why}), pod needs {need}", held == 0
        )

    gpu_slots = np.array([record.slot_by_uuid[g.uuid] for g in usable], dtype=np.intp)
    if mig_ok and (not usable or demand.mig_only):
        return _mig_reason(record, [record.slot_by_uuid[g.uuid] for g in healthy], demand, need)
    if not demand.whole and gpu_slots.size and demand.memory_bytes is not None:
        largest = int(state.mem_total[slot, gpu_slots].max())
        if demand.memory_bytes > largest:
            return Reason(
                f"pod needs {memory_words(demand.memory_bytes)} GPU memory per card, "
                f"largest GPU here has {memory_words(largest)}",
                True,
            )
    fits_row = _fits_row(state, slot, demand, constraints)
    fitting = int(fits_row.sum())
    if demand.whole and fitting < demand.gpus:
        return Reason(f"{fitting} of {total} GPUs fully free, pod needs {need}", False)
    if not demand.whole and fitting < demand.gpus:
        return Reason(_share_reason(record, state, slot, demand, gpu_slots, fitting, need), False)
    if not demand.whole:
        # Room enough, but memory-only and compute shares keep to separate cards (core/memory_only.py).
        apart = fits_row & rule_fits(state, lambda array: array[slot], demand)
        if int(apart.sum()) < demand.gpus:
            blocked = np.flatnonzero(fits_row & ~apart).tolist()
            holders = [(record.gpus[g].index, FULL_PERCENT - int(state.core_free[slot, g])) for g in blocked]
            return Reason(memory_only.refusal(demand, need, holders), False)
        fits_row = apart
    if demand.burst is not None:
        fits_row = fits_row & _burst_row(state, slot, demand)
        if int(fits_row.sum()) < demand.gpus:
            ratio = int(state.burst_ratio[slot])
            # Without the pool's ratio label waiting helps nothing; with it, pods leaving may make room.
            return Reason(overcommit.refusal(demand, ratio), ratio <= 0)
    if demand.gpus > 1 and len({gpu.model_label for gpu in usable}) > 1:
        per_model = _fitting_per_model(record, fits_row)
        if max(per_model.values(), default=0) < demand.gpus:
            word = "fully free" if demand.whole else "fitting"
            counts = ", ".join(f"{model}: {n}" for model, n in sorted(per_model.items()))
            return Reason(
                f"no GPU model has {demand.gpus} {word} GPUs ({counts}); all cards of a pod are of one model",
                False,
            )
    if constraints.scope in SCOPE_GROUPS:
        best = int(largest_group_count(state, np.array([slot]), fits_row[None, :], constraints.scope)[0])
        kind = _SCOPE_WORDS[constraints.scope]
        word = "fully free" if demand.whole else "fitting"
        return Reason(
            f"no {kind} has {demand.gpus} {word} GPUs (most in one {kind}: {best}), "
            f"pod requires topology scope {constraints.scope}",
            False,
        )
    return Reason(f"node cannot take {need}", False)


def no_mig_gpu_words(need: str) -> str:
    """A MIG-only pod on a node without MIG GPUs (reasons_bulk.py says the same)."""
    return f"pod asks for a MIG instance ({names.GPU_MODE}=mig) for {need}, but no GPU here is in MIG mode"


def _mig_reason(record: NodeRecord, eligible: list[int], demand: Demand, need: str) -> Reason:
    """No free instance holds the share, and (core/mig_placement.py) none can be created: why, per GPU."""
    views = gpuchoice.mig_views(record, eligible)
    needs = [demand.memory_need_on(v.gpu.memory_bytes) for v in views]
    free = sorted(
        (c.memory_bytes, c.profile) for v in views for c in mig_placement.free_instances(v)
    )
    listed = ", ".join(profile for _, profile in free) or "none"
    text = f"no free MIG instance holds {need} (free instances: {listed})"
    if not views:
        return Reason(f"{text}; every MIG GPU here is held outside fgpu", False)
    said: dict[str, list[int]] = {}
    blocked = mig_placement.blocked(views, needs)
    for why, memory in zip(blocked, needs, strict=True):
        if why.unknown:
            clause = "no new instance on {gpus}: it reports no MIG profiles or an instance without a placement"
        elif not why.profile:
            largest = f"{why.largest}, {memory_words(why.largest_bytes)}" if why.largest else "none"
            clause = f"no MIG profile of {{gpus}} holds {memory_words(memory)} (largest: {largest})"
        else:
            holds = ", ".join(why.taken) or "nothing"
            clause = f"no placement for profile {why.profile} is free on {{gpus}} (holds {holds})"
        said.setdefault(clause, []).append(record.gpus[why.slot].index)
    parts = [
        clause.format(gpus=("GPU " if len(idx) == 1 else "GPUs ") + ", ".join(map(str, idx)))
        for clause, idx in said.items()
    ]
    # Waiting helps unless no profile of any GPU is large enough and no instance is either.
    never = all(not b.unknown and not b.profile for b in blocked) and not any(
        m.memory_bytes >= n for v, n in zip(views, needs, strict=True) for m in v.gpu.mig_instances
    )
    return Reason(f"{text} and {'; '.join(parts)}", never)


def _fitting_per_model(record: NodeRecord, fits_row: BoolArray) -> dict[str, int]:
    counts: dict[str, int] = {}
    for slot in np.flatnonzero(fits_row).tolist():
        model = record.gpus[slot].model_label
        counts[model] = counts.get(model, 0) + 1
    return counts


def _fits_row(state: ClusterState, slot: int, demand: Demand, constraints: Constraints) -> BoolArray:
    model_ok = constraints.allowed_models[state.model_id[slot]]
    eligible = state.gpu_usable[slot] & model_ok
    core_free, mem_free, mem_total = state.core_free[slot], state.mem_free[slot], state.mem_total[slot]
    if demand.whole:
        row: BoolArray = eligible & (core_free == state.core_total[slot]) & (mem_free == mem_total)
    else:
        row = eligible & (core_free >= demand.core_percent) & (mem_free >= demand.memory_need(mem_total))
    return row


def _burst_row(state: ClusterState, slot: int, demand: Demand) -> BoolArray:
    """The burstable rule (core/overcommit.py) on the node's GPUs, as the filter applies it."""
    one = slice(slot, slot + 1)
    row: BoolArray = overcommit.burst_fits(
        demand, ratio=state.burst_ratio[one], mem_total=state.mem_total[one],
        guaranteed_core=state.guaranteed_core[one], guaranteed_mem=state.guaranteed_mem[one],
        burst_core=state.burst_core[one], burst_mem=state.burst_mem[one],
    )[0]
    return row


def _share_reason(
    record: NodeRecord,
    state: ClusterState,
    slot: int,
    demand: Demand,
    gpu_slots: SlotArray,
    fitting: int,
    need: str,
) -> str:
    core_free = state.core_free[slot, gpu_slots]
    mem_free = state.mem_free[slot, gpu_slots]
    mem_total = state.mem_total[slot, gpu_slots]
    # The GPU closest to fitting: most free compute, then most free memory.
    best = int(np.lexsort((mem_free, core_free))[-1])
    index = record.gpus[int(gpu_slots[best])].index
    most = f"most free: GPU {index} with {int(core_free[best])}% core, {memory_words(int(mem_free[best]))}"
    if demand.gpus == 1:
        memory_need = memory_words(demand.memory_need_on(int(mem_total[best])))
        return f"no GPU has {demand.core_percent}% core and {memory_need} memory free for {need} ({most})"
    return f"{fitting} of {len(gpu_slots)} GPUs can take a card, pod needs {need} ({most})"
