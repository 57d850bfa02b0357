"""Reasons for many rejected nodes at once.

The extender's filter must say why each of thousands of nodes failed. Most
fail for a handful of plain reasons (CPU, memory, not enough free GPUs, a taint) that
can be told from array columns, so those are worked out for all nodes in one
pass; the rest (unknown node, labels, models, health, MIG, topology, a
burstable pod's GPUs) go through `reasons.explain` one by one. Both paths produce the same words;
tests hold them to it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from scheduler_plugin.core import memory_only
from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import FULL_PERCENT
from scheduler_plugin.core.filtering import (
    BoolArray,
    Constraints,
    SlotArray,
    memory_fits,
    node_rules_apply,
    node_rules_pass,
    rule_fits,
    tolerated_sets,
)
from scheduler_plugin.core.labels import LabelIndex
from scheduler_plugin.core.noderules import NodeRules, PodNodeNeeds, refusal, taint_refusal, untolerated
from scheduler_plugin.core.reasons import Reason, describe_demand, memory_words, no_mig_gpu_words

#: Bits below a GPU's free core percent when ranking GPUs by (core free, memory free).
_MEMORY_BITS = 46


def explain_many(
    *,
    state: ClusterState,
    labels: LabelIndex,
    slots: SlotArray,
    fits: BoolArray,
    constraints: Constraints,
    one_by_one: Callable[[int], Reason],
    gpu_index: Callable[[int, int], int],
) -> list[Reason]:
    """A reason per slot (all rejected); `fits` are the filter's rows for them.

    `one_by_one(slot)` explains a node the slow way; `gpu_index(slot, column)`
    gives the GPU index a person sees for a GPU slot.
    """
    demand = constraints.demand
    pod = constraints.pod
    count = len(slots)
    reasons: list[Reason | None] = [None] * count
    simple = state.active[slots].copy()
    if pod.node_selector or pod.affinity_terms:
        simple &= labels.match(slots, selector=pod.node_selector, terms=pod.affinity_terms)
    if node_rules_apply(state, pod.node_needs):
        passing = node_rules_pass(state, slots, pod.node_needs)
        _rule_reasons(state, slots, pod.node_needs, simple & ~passing, reasons)
        simple &= passing

    cpu_alloc = state.cpu_alloc[slots]
    cpu_free = state.cpu_free[slots]
    cpu_short = (cpu_alloc > 0) & (cpu_free < demand.cpu_milli) if demand.cpu_milli else np.zeros(count, bool)
    mem_alloc = state.host_mem_alloc[slots]
    mem_free = state.host_mem_free[slots]
    mem_short = (
        (mem_alloc > 0) & (mem_free < demand.host_memory_bytes)
        if demand.host_memory_bytes
        else np.zeros(count, bool)
    )
    for i in np.flatnonzero(simple & cpu_short).tolist():
        text = f"insufficient cpu: {int(cpu_free[i])}m free, pod needs {demand.cpu_milli}m"
        reasons[i] = Reason(text, demand.cpu_milli > int(cpu_alloc[i]))
    need_memory = memory_words(demand.host_memory_bytes)
    for i in np.flatnonzero(simple & ~cpu_short & mem_short).tolist():
        text = f"insufficient memory: {memory_words(int(mem_free[i]))} free, pod needs {need_memory}"
        reasons[i] = Reason(text, demand.host_memory_bytes > int(mem_alloc[i]))

    gpu_stage = simple & ~cpu_short & ~mem_short
    # A burstable pod also meets the pool's ratio rule (core/overcommit.py); the filter's rows
    # mix it with free capacity, so its GPU reasons are told node by node.
    if demand.wants_gpu and demand.burst is None and gpu_stage.any():
        _gpu_reasons(state, slots, fits, constraints, gpu_stage, reasons, gpu_index)

    return [
        reason if reason is not None else one_by_one(int(slot))
        for reason, slot in zip(reasons, slots, strict=True)
    ]


def _rule_reasons(
    state: ClusterState, slots: SlotArray, needs: PodNodeNeeds, refused: BoolArray, reasons: list[Reason | None]
) -> None:
    """Reasons for nodes the node rules refuse: one per distinct taint set, the rest node by node."""
    tolerated = tolerated_sets(state, needs)
    by_set: dict[int, Reason] = {}
    for i in np.flatnonzero(refused).tolist():
        slot = int(slots[i])
        taint_set = int(state.taint_set[slot])
        if not tolerated[taint_set]:
            reason = by_set.get(taint_set)
            if reason is None:
                taint = untolerated(state.taint_sets[taint_set], needs.tolerations)
                assert taint is not None  # the set is not tolerated
                why = taint_refusal(taint)
                reason = by_set[taint_set] = Reason(why.text, why.unresolvable)
            reasons[i] = reason
            continue
        # Tolerated: unenforced limits, a host port or the pod count refuse it, with the same words
        # as one by one.
        rule = refusal(
            NodeRules(max_pods=int(state.max_pods[slot]), limits_unenforced=state.limits_why.get(slot, "")),
            needs,
            pods_on_node=int(state.pod_count[slot]),
            ports_in_use=state.host_ports.get(slot, ()),
        )
        if rule is not None:
            reasons[i] = Reason(rule.text, rule.unresolvable)


def _gpu_reasons(
    state: ClusterState,
    slots: SlotArray,
    fits: BoolArray,
    constraints: Constraints,
    stage: BoolArray,
    reasons: list[Reason | None],
    gpu_index: Callable[[int, int], int],
) -> None:
    demand = constraints.demand
    need = describe_demand(demand)
    present = state.gpu_present[slots]
    total = present.sum(axis=1)
    allowed = constraints.allowed_models[state.model_id[slots]] & present
    usable = state.gpu_usable[slots] & allowed
    n_usable = usable.sum(axis=1)
    # Plain nodes: a report with GPUs, every GPU of an allowed model, healthy and fgpu's to give.
    plain = (
        stage & state.has_devices[slots] & (total > 0) & (allowed.sum(axis=1) == total) & (n_usable == total)
    )
    if demand.mig_only:
        # Plain nodes have no GPU in MIG mode; the rest are explained one by one.
        no_mig = Reason(no_mig_gpu_words(need), True)
        for i in np.flatnonzero(plain).tolist():
            reasons[i] = no_mig
        return
    if demand.memory_bytes is not None and not demand.whole:
        plain &= state.mem_total[slots].max(axis=1) >= demand.memory_bytes
    fitting = fits.sum(axis=1)
    plain &= fitting < demand.gpus  # otherwise the failure is topology: explained one by one
    few = plain & (total < demand.gpus)
    for i in np.flatnonzero(few).tolist():
        n = int(total[i])
        reasons[i] = Reason(f"node has {n} GPU{'s' if n != 1 else ''}, pod needs {need}", True)
    busy = plain & ~few
    rows = np.flatnonzero(busy)
    if not len(rows):
        return
    if demand.whole:
        # Few distinct (free, total) pairs across a cluster: one Reason each.
        said: dict[tuple[int, int], Reason] = {}
        for i, free, of in zip(rows.tolist(), fitting[rows].tolist(), total[rows].tolist(), strict=True):
            reason = said.get((free, of))
            if reason is None:
                reason = said[(free, of)] = Reason(f"{free} of {of} GPUs fully free, pod needs {need}", False)
            reasons[i] = reason
        return
    core_free = state.core_free[slots[rows]]
    mem_free = state.mem_free[slots[rows]]
    mem_total = state.mem_total[slots[rows]]
    fitting = _apart_reasons(state, slots, rows, fitting, usable, constraints, reasons, gpu_index)
    # Unusable columns (padding, other models) sort below any real GPU, even one whose free
    # core or memory is negative because bound pods over-allocated it.
    key = np.where(usable[rows], (core_free << _MEMORY_BITS) + mem_free, np.iinfo(np.int64).min)
    # The last GPU among equals, as a stable sort by (core free, memory free) would put last.
    width = key.shape[1]
    best = width - 1 - np.argmax(key[:, ::-1], axis=1)
    picked = np.arange(len(rows))
    best_core = core_free[picked, best].tolist()
    best_mem = mem_free[picked, best].tolist()
    best_total = mem_total[picked, best].tolist()
    for k, i in enumerate(rows.tolist()):
        if reasons[i] is not None:
            continue
        index = gpu_index(int(slots[i]), int(best[k]))
        most = f"most free: GPU {index} with {best_core[k]}% core, {memory_words(best_mem[k])}"
        if demand.gpus == 1:
            memory_need = memory_words(demand.memory_need_on(best_total[k]))
            text = f"no GPU has {demand.core_percent}% core and {memory_need} memory free for {need} ({most})"
        else:
            text = f"{int(fitting[i])} of {int(n_usable[i])} GPUs can take a card, pod needs {need} ({most})"
        reasons[i] = Reason(text, False)


def _apart_reasons(
    state: ClusterState,
    slots: SlotArray,
    rows: SlotArray,
    fitting: npt.NDArray[np.int64],
    usable: BoolArray,
    constraints: Constraints,
    reasons: list[Reason | None],
    gpu_index: Callable[[int, int], int],
) -> npt.NDArray[np.int64]:
    """Reasons for `rows` that only the memory-only rule (core/memory_only.py) refuses; the GPUs that
    fit each row without the rule, as `reasons.explain` counts them for the others."""
    demand = constraints.demand
    if not memory_only.is_memory_only(demand) and not state.mem_only_rows:
        return fitting
    at = slots[rows]
    plain = usable[rows] & (state.core_free[at] >= demand.core_percent)
    plain &= memory_fits(demand, state.mem_free[at], state.mem_total[at])
    apart = plain & rule_fits(state, lambda array: array[at], demand)
    fitting = fitting.copy()
    counts = plain.sum(axis=1)
    fitting[rows] = counts
    need = describe_demand(demand)
    for k in np.flatnonzero((counts >= demand.gpus) & (apart.sum(axis=1) < demand.gpus)).tolist():
        i = int(rows[k])
        blocked = np.flatnonzero(plain[k] & ~apart[k]).tolist()
        held = [(gpu_index(int(slots[i]), g), FULL_PERCENT - int(state.core_free[at[k], g])) for g in blocked]
        reasons[i] = Reason(memory_only.refusal(demand, need, held), False)
    return fitting
