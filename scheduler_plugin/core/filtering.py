"""Which nodes can take a pod, decided for all candidate nodes at once.

Every check is an array operation over the candidates' rows of `ClusterState`;
nothing here loops over nodes in Python. Why a node failed is worked out
afterwards, only for the nodes whose reasons are asked for (`reasons.py`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_plugin.core import memory_only, overcommit
from scheduler_plugin.core.api import PodRequest
from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import FULL_PERCENT, Demand
from scheduler_plugin.core.labels import LabelIndex
from scheduler_plugin.core.noderules import PodNodeNeeds, port_clash, untolerated

BoolArray = npt.NDArray[np.bool_]
SlotArray = npt.NDArray[np.intp]

#: Topology scopes a multi-GPU pod may require, and the group array each one uses.
SCOPE_GROUPS = {"nvlink": "nvlink_group", "pcie": "pcie_group", "numa": "numa_group"}
#: Every valid value of PodRequest.topology_scope ("" and "node" constrain nothing).
SCOPES = ("", "node", *SCOPE_GROUPS)


@dataclass(frozen=True)
class Constraints:
    """A pod's constraints in array form, computed once per decision."""

    demand: Demand
    #: allowed[model_id]; one extra trailing False so model_id -1 (no GPU) indexes it
    allowed_models: BoolArray
    #: the job's model when the job already has one
    job_model: str | None
    pod: PodRequest

    @property
    def scope(self) -> str:
        return self.pod.topology_scope


def model_table(state: ClusterState, pod: PodRequest, job_model: str | None) -> BoolArray:
    """allowed[model_id] for the pod's use/avoid lists and its job's model."""
    table = np.zeros(len(state.models) + 1, dtype=np.bool_)
    for index, model in enumerate(state.models):
        table[index] = (
            (not pod.model_use or model in pod.model_use)
            and model not in pod.model_avoid
            and (job_model is None or model == job_model)
        )
    return table


@dataclass(frozen=True)
class FitResult:
    slots: SlotArray
    feasible: BoolArray
    #: fits[i, g]: GPU slot g of slots[i] can take one card (regular GPUs)
    fits: npt.NDArray[np.bool_]
    #: mig[i, g]: GPU slot g of slots[i] has a free MIG instance big enough (single-card shares only)
    mig: npt.NDArray[np.bool_] | None


def fit(
    state: ClusterState,
    labels: LabelIndex,
    slots: SlotArray | None,
    constraints: Constraints,
) -> FitResult:
    """Fit of the pod on `slots`, or on every row of the state when `slots` is None.

    The whole-state form reads the arrays in place, which is several times faster
    than gathering the rows of nearly every node first.
    """
    demand = constraints.demand
    pod = constraints.pod
    if slots is None:
        rows = np.arange(state.capacity, dtype=np.intp)

        def take(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return array

        feasible: BoolArray = state.active.copy()
    else:
        rows = slots

        def take(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return array[slots]

        feasible = state.active[slots]
    if pod.node_selector or pod.affinity_terms:
        feasible &= labels.match(rows, selector=pod.node_selector, terms=pod.affinity_terms)
    if node_rules_apply(state, pod.node_needs):
        feasible &= node_rules_pass(state, rows, pod.node_needs)
    if demand.cpu_milli:
        feasible &= (take(state.cpu_alloc) == 0) | (take(state.cpu_free) >= demand.cpu_milli)
    if demand.host_memory_bytes:
        feasible &= (take(state.host_mem_alloc) == 0) | (
            take(state.host_mem_free) >= demand.host_memory_bytes
        )
    if not demand.wants_gpu:
        return FitResult(rows, feasible, np.zeros((len(rows), state.max_gpus), dtype=np.bool_), None)

    model_ok: BoolArray | None = None
    if not constraints.allowed_models[:-1].all():
        model_ok = constraints.allowed_models[take(state.model_id)]
    if demand.whole:
        fits = take(state.gpu_whole_free)
        fits = fits & model_ok if model_ok is not None else fits.copy()
    else:
        eligible = take(state.gpu_usable)
        if model_ok is not None:
            eligible = eligible & model_ok
        fits = eligible & rule_fits(state, take, demand)
        fits &= memory_fits(demand, take(state.mem_free), take(state.mem_total))
        if demand.burst is not None:
            fits &= overcommit.burst_fits(
                demand, ratio=take(state.burst_ratio), mem_total=take(state.mem_total),
                guaranteed_core=take(state.guaranteed_core), guaranteed_mem=take(state.guaranteed_mem),
                burst_core=take(state.burst_core), burst_mem=take(state.burst_mem),
            )
        if demand.mig_only:
            fits[...] = False  # fgpu.io/gpu-mode: mig (apis/mig.py): no regular GPU serves it
    gpu_ok = np.count_nonzero(fits, axis=1) >= demand.gpus
    mig = None
    if demand.mig_eligible and state.mig_rows:
        mig_free = take(state.mig_free_max)
        mig = (mig_free > 0) & memory_fits(demand, mig_free, take(state.mem_total))
        if model_ok is not None:
            mig &= model_ok
        gpu_ok |= mig.any(axis=1)
    if demand.gpus > 1:
        if constraints.scope in SCOPE_GROUPS:
            gpu_ok &= largest_group_count(state, rows, fits, constraints.scope) >= demand.gpus
        # A pod's cards are all of one model; only nodes that mix models need the per-model look.
        for i in np.flatnonzero(gpu_ok & take(state.mixed_models)).tolist():
            gpu_ok[i] = bool(models_that_fit(state, int(rows[i]), fits[i], constraints.scope, demand.gpus))
    feasible &= gpu_ok
    return FitResult(rows, feasible, fits, mig)


def node_rules_apply(state: ClusterState, needs: PodNodeNeeds) -> bool:
    """Whether any node rule can refuse the pod anywhere (most clusters without Node facts: no)."""
    return bool(state.rules_rows) or (bool(needs.host_ports) and bool(state.host_ports))


def tolerated_sets(state: ClusterState, needs: PodNodeNeeds) -> BoolArray:
    """tolerated[taint set id]: the pod tolerates every taint of that set (one check per distinct set)."""
    return np.fromiter(
        (untolerated(taints, needs.tolerations) is None for taints in state.taint_sets),
        dtype=np.bool_,
        count=len(state.taint_sets),
    )


def node_rules_pass(state: ClusterState, rows: SlotArray, needs: PodNodeNeeds) -> BoolArray:
    """Rows whose node rules (core/noderules.py: taints, cordon, conditions, host ports, max pods)
    let the pod on; `noderules.refusal` says why for the others, in words."""
    ok: BoolArray = tolerated_sets(state, needs)[state.taint_set[rows]]
    max_pods = state.max_pods[rows]
    ok &= (max_pods == 0) | (state.pod_count[rows] < max_pods)
    if needs.needs_limits:
        ok &= ~state.limits_unenforced[rows]
    if needs.host_ports and state.host_ports:
        # Few nodes run pods with host ports: those are checked one by one.
        for i in np.flatnonzero(ok & state.has_host_ports[rows]).tolist():
            if port_clash(needs.host_ports, state.host_ports[int(rows[i])]) is not None:
                ok[i] = False
    return ok


def rule_fits(
    state: ClusterState, take: Callable[[npt.NDArray[Any]], npt.NDArray[Any]], demand: Demand
) -> BoolArray:
    """The share's compute fits, and (core/memory_only.py) memory-only and compute shares stay apart.

    A memory-only share needs the card's whole compute free, though it reserves none of it.
    """
    if memory_only.is_memory_only(demand):
        alone: BoolArray = take(state.core_free) >= FULL_PERCENT
        return alone
    fits: BoolArray = take(state.core_free) >= demand.core_percent
    if state.mem_only_rows:
        fits &= ~take(state.mem_only_held)
    return fits


def memory_fits(demand: Demand, free: npt.NDArray[np.int64], total: npt.NDArray[np.int64]) -> BoolArray:
    """free >= demand.memory_need(total), without dividing (a ratio share compares products)."""
    ratio = demand.memory_ratio_percent
    if demand.memory_bytes is None and ratio is not None:
        # floor(total * ratio / 100) <= free  <=>  total * ratio <= 100 * free + 99
        result: BoolArray = total * ratio <= free * FULL_PERCENT + (FULL_PERCENT - 1)
        return result
    result = free >= demand.memory_need(total)
    return result


def largest_group_count(
    state: ClusterState, slots: SlotArray, fits: BoolArray, scope: str
) -> npt.NDArray[np.int64]:
    """Per node, the most fitting GPUs inside one group of the scope's kind."""
    groups = getattr(state, SCOPE_GROUPS[scope])[slots]
    width = state.max_gpus
    same = (groups[:, :, None] == np.arange(width)) & fits[:, :, None]
    counts: npt.NDArray[np.int64] = same.sum(axis=1).max(axis=1)
    return counts


def models_that_fit(state: ClusterState, slot: int, fits_row: BoolArray, scope: str, cards: int) -> list[int]:
    """Model ids whose fitting GPUs on the node can hold all `cards` (inside one scope group,
    when a scope is required), tightest first: the fewest fitting GPUs, then the model name."""
    models = state.model_id[slot]
    candidates = []
    for model in sorted(set(models[fits_row].tolist())):
        mine = fits_row & (models == model)
        count = int(np.count_nonzero(mine))
        if count < cards:
            continue
        if (
            scope in SCOPE_GROUPS
            and largest_group_count(state, np.array([slot]), mine[None, :], scope)[0] < cards
        ):
            continue
        candidates.append((count, state.models[model], model))
    return [model for _, _, model in sorted(candidates)]


def scope_groups_that_fit(
    state: ClusterState, slot: int, fits_row: BoolArray, scope: str, cards: int
) -> list[BoolArray]:
    """`fits_row` split by the node's groups of the scope's kind, keeping groups that hold all
    `cards`, tightest first (the fewest fitting GPUs, then the group id)."""
    groups = getattr(state, SCOPE_GROUPS[scope])[slot]
    candidates = []
    for group in sorted(set(groups[fits_row].tolist()) - {-1}):
        mine = fits_row & (groups == group)
        count = int(np.count_nonzero(mine))
        if count >= cards:
            candidates.append((count, group, mine))
    return [mine for _, _, mine in sorted(candidates, key=lambda c: (c[0], c[1]))]


def slots_for(state: ClusterState, names: Sequence[str]) -> SlotArray:
    """Slots of the named nodes, -1 for names the state does not know."""
    if not names:
        return np.zeros(0, dtype=np.intp)
    try:
        # One C-level lookup for the whole list; only a list with an unknown name pays more.
        found = operator.itemgetter(*names)(state.slot_of)
    except KeyError:
        slot_of = state.slot_of
        return np.fromiter((slot_of.get(name, -1) for name in names), dtype=np.intp, count=len(names))
    return np.array([found] if len(names) == 1 else found, dtype=np.intp)
