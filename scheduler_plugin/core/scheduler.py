"""`Scheduler`: the decision core behind the `Core` facade.

Records (`records.py`) are the truth; `ClusterState` arrays are rebuilt per
node from them after every change, and filter/score read only the arrays.
Nothing here does I/O; time comes from the injected clock and is read only to
stamp and expire assumed allocations.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from apis import names
from apis.allocation import Allocation
from apis.device_object import check_unique_uuids
from apis.devices import NodeDevices
from scheduler_plugin.core import gpuchoice, views
from scheduler_plugin.core.api import (
    Clock,
    Code,
    Core,
    NodeInfo,
    NodeName,
    NodeVerdict,
    NodeView,
    PodRequest,
    PodUID,
    SchedulingError,
    Status,
)
from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import Demand, demand_of
from scheduler_plugin.core.filtering import (
    SCOPE_GROUPS,
    SCOPES,
    Constraints,
    FitResult,
    fit,
    model_table,
    models_that_fit,
    scope_groups_that_fit,
)
from scheduler_plugin.core.jobs import JobModels
from scheduler_plugin.core.labels import LabelIndex
from scheduler_plugin.core.ordering import NodeOrder
from scheduler_plugin.core.policies import DEFAULT_POLICY, Policy, PolicyContext, make_policy
from scheduler_plugin.core.reasons import Reason, explain
from scheduler_plugin.core.reasons_bulk import explain_many
from scheduler_plugin.core.records import NodeRecord, PodRecord, write_node_row

#: A decision over at least 1/this of the node slots computes (and keeps) the whole cluster's fit.
_FULL_PASS_FRACTION = 4
_UNKNOWN_NODE = "node is not known to the fgpu scheduler (no Node object or Device report seen)"


class Scheduler:
    """Implements `scheduler_plugin.core.api.Core`.

    Not thread-safe: adapters serialize calls (one lock around the core), which
    also makes each filter/score/reserve sequence see one consistent state.
    """

    def __init__(
        self,
        *,
        policy: str = DEFAULT_POLICY,
        gpu_policy: str | None = None,
        assume_ttl_s: float = 60.0,
        clock: Clock = time.monotonic,
        tie_break_seed: int | None = None,
        policy_params: Mapping[str, float] | None = None,
        gpu_policy_params: Mapping[str, float] | None = None,
        policy_options: Mapping[str, Any] | None = None,
        require_node_info: bool = False,
    ) -> None:
        """`require_node_info`: a node takes pods only while its Node facts are known (the state comes
        from the Kubernetes API, where a Device lingers after its Node is deleted); without it (the
        embedded store, simulators) a Device report alone makes a node."""
        if assume_ttl_s <= 0:
            raise ValueError(f"assume_ttl_s={assume_ttl_s} must be > 0 seconds")
        self.state = ClusterState()
        self.labels = LabelIndex()
        self.clock = clock
        self.assume_ttl_s = assume_ttl_s
        self.tie_break_seed = tie_break_seed
        self._nodes: dict[NodeName, NodeRecord] = {}
        self._require_node_info = require_node_info
        self._pods: dict[PodUID, PodRecord] = {}
        self._jobs = JobModels()
        #: > 0 while a planner tries moves out (`hypothetical`)
        self._hypothetical = 0
        options = policy_options or {}
        self.node_policy: Policy = make_policy(
            policy,
            context=PolicyContext(
                state=self.state, params=policy_params or {}, options=options, seed=tie_break_seed
            ),
        )
        if gpu_policy is None or (gpu_policy == policy and gpu_policy_params is None):
            self.gpu_policy: Policy = self.node_policy
        else:
            self.gpu_policy = make_policy(
                gpu_policy,
                context=PolicyContext(
                    state=self.state, params=gpu_policy_params or {}, options=options, seed=tie_break_seed
                ),
            )
        self.state.add_listener(self.node_policy)
        self.state.add_listener(self.gpu_policy)
        self.order = NodeOrder(self.state, tie_break_seed=tie_break_seed)
        self._passed: tuple[int, npt.NDArray[np.object_]] | None = None
        self._last_fit: tuple[int, PodRequest, FitResult] | None = None

    @property
    def require_node_info(self) -> bool:
        return self._require_node_info

    @require_node_info.setter
    def require_node_info(self, required: bool) -> None:
        if required == self._require_node_info:
            return
        self._require_node_info = required
        for record in self._nodes.values():
            record.require_info = required
            self._refresh(record)

    # --- state feed --------------------------------------------------------------

    def upsert_node_devices(self, devices: NodeDevices) -> list[str]:
        """Raises DeviceError (before changing anything) when `devices` lists a UUID twice."""
        check_unique_uuids(devices, what=f"devices of node {devices.node_name}")
        name = NodeName(devices.node_name)
        record = self._record(name)
        record.set_devices(devices)
        self._refresh(record)
        return [
            f"pod {pod.request.key} holds GPU {share.mig_uuid or share.uuid} (minor {share.minor}) "
            f"on node {name}, which the node no longer reports; its share is not counted"
            for pod, share in record.dangling_shares()
        ]

    def upsert_node_info(self, info: NodeInfo) -> None:
        record = self._record(info.name)
        record.info = info
        self.labels.set_labels(
            self.state.slot_of[info.name], {**info.labels, names.NODE_NAME_FIELD: info.name}
        )
        self._refresh(record)

    def remove_node(self, name: NodeName) -> None:
        record = self._nodes.get(name)
        if record is None:
            return
        record.info = None
        record.set_devices(None)
        self._refresh(record)
        self._forget_if_unused(record)

    def add_pod(self, pod: PodRequest, node: NodeName, allocation: Allocation | None) -> None:
        existing = self._pods.get(pod.uid)
        if existing is None:
            self._tell_policies(demand_of(pod))
        else:
            if (
                allocation is None
                and existing.node == node
                and existing.allocation is not None
                and pod.device is not None
            ):
                # Bound before the informer shows the annotation: keep what was reserved.
                allocation = existing.allocation
            if not existing.assumed and existing.node == node and existing.allocation == allocation:
                return
            self._drop(existing)
        self._place(PodRecord(request=pod, node=node, allocation=allocation, assumed=False))

    @contextmanager
    def hypothetical(self) -> Iterator[None]:
        """Pods reserved, removed and added back inside are a simulation (the defrag planner's, which
        undoes its changes): policies that learn the workload do not count them, so trying moves
        out never skews what the live scheduler learned."""
        self._hypothetical += 1
        try:
            yield
        finally:
            self._hypothetical -= 1

    def _tell_policies(self, demand: Demand) -> None:
        """A pod new to the core, reserved or found bound: policies that learn the workload count it."""
        if self._hypothetical:
            return
        self.node_policy.pod_added(demand)
        if self.gpu_policy is not self.node_policy:
            self.gpu_policy.pod_added(demand)

    def remove_pod(self, uid: PodUID) -> None:
        record = self._pods.get(uid)
        if record is not None:
            self._drop(record)

    # --- decisions ---------------------------------------------------------------

    def filter(self, pod: PodRequest, nodes: Sequence[NodeName] | None = None) -> list[NodeVerdict]:
        constraints = self._constraints(pod)
        names_, slots = self.order.all_nodes() if nodes is None else (nodes, self.order.slots_of(nodes))
        known = np.flatnonzero(slots >= 0)
        result = self._fit(slots[known], constraints)
        feasible = np.zeros(len(names_), dtype=np.bool_)
        feasible[known] = result.feasible
        failing = known[~result.feasible]
        reasons = explain_many(
            state=self.state,
            labels=self.labels,
            slots=slots[failing],
            fits=result.fits[~result.feasible],
            constraints=constraints,
            one_by_one=lambda slot: self._explain(slot, constraints),
            gpu_index=lambda slot, column: self._nodes[NodeName(self.state.names[slot])].gpus[column].index,
        )
        # Start from every node passing (one shared verdict object per node), then overwrite.
        verdicts: list[NodeVerdict] = self._pass_verdicts()[np.maximum(slots, 0)].tolist()
        for position in np.flatnonzero(slots < 0).tolist():
            verdicts[position] = NodeVerdict(NodeName(names_[position]), False, _UNKNOWN_NODE, True)
        for position, reason in zip(failing.tolist(), reasons, strict=True):
            verdicts[position] = NodeVerdict(
                NodeName(names_[position]), False, reason.text, reason.unresolvable
            )
        return verdicts

    def _pass_verdicts(self) -> npt.NDArray[np.object_]:
        """verdicts[slot]: the node's passing verdict, kept while nodes neither join nor leave."""
        version = self.state.membership_version
        if self._passed is None or self._passed[0] != version or len(self._passed[1]) != self.state.capacity:
            table = np.empty(self.state.capacity, dtype=object)
            table[:] = [NodeVerdict(NodeName(name), True) for name in self.state.names]
            self._passed = (version, table)
        return self._passed[1]

    def explain_node(self, pod: PodRequest, node: NodeName) -> NodeVerdict:
        """The verdict for one node, worked out on its own (filter's answer for that node)."""
        constraints = self._constraints(pod)
        slot = self.state.slot_of.get(node)
        if slot is None:
            return NodeVerdict(node, False, _UNKNOWN_NODE, True)
        if fit(self.state, self.labels, np.array([slot], dtype=np.intp), constraints).feasible[0]:
            return NodeVerdict(node, True)
        reason = self._explain(slot, constraints)
        return NodeVerdict(node, False, reason.text, reason.unresolvable)

    def _fit(self, slots: npt.NDArray[np.intp], constraints: Constraints) -> FitResult:
        """`fit` for the given slots, answered from one whole-cluster pass per pod and state.

        An adapter asks filter, score and reserve about the same pod in a row; with
        nothing changed in between, the second and third questions are a gather.
        """
        state = self.state
        cached = self._last_fit
        if cached is not None and cached[0] == state.version and cached[1] == constraints.pod:
            full = cached[2]
        elif len(slots) * _FULL_PASS_FRACTION >= state.capacity:
            full = fit(state, self.labels, None, constraints)
            self._last_fit = (state.version, constraints.pod, full)
        else:
            return fit(state, self.labels, slots, constraints)
        return FitResult(
            slots=slots,
            feasible=full.feasible[slots],
            fits=full.fits[slots],
            mig=None if full.mig is None else full.mig[slots],
        )

    def _explain(self, slot: int, constraints: Constraints) -> Reason:
        record = self._nodes.get(NodeName(self.state.names[slot]))
        return explain(
            state=self.state, labels=self.labels, record=record, slot=slot, constraints=constraints
        )

    def score(self, pod: PodRequest, nodes: Sequence[NodeName]) -> list[tuple[NodeName, int]]:
        constraints = self._constraints(pod)
        slots = self.order.slots_of(nodes)
        known = np.flatnonzero(slots >= 0)
        result = self._fit(slots[known], constraints)
        scores = np.zeros(len(nodes), dtype=np.float64)
        ok = result.feasible
        if ok.any():
            raw = self.node_policy.score(result.slots[ok], constraints.demand, result.fits[ok])
            scores[known[ok]] = raw
        rounded = np.clip(np.rint(scores), 0, 100).astype(np.int64).tolist()
        return list(zip(nodes, rounded, strict=True))

    def select(self, pod: PodRequest, nodes: Sequence[NodeName] | None = None) -> NodeName | None:
        constraints = self._constraints(pod)
        if nodes is None:
            slots = self.state.active_slots()
        else:
            slots = self.order.slots_of(nodes)
            slots = slots[slots >= 0]
        result = self._fit(slots, constraints)
        best = self._best(result, constraints)
        return None if best is None else NodeName(self.state.names[best])

    def reserve(self, pod: PodRequest, node: NodeName) -> Allocation:
        existing = self._pods.get(pod.uid)
        if existing is not None:
            if existing.node == node:
                return existing.allocation or Allocation(gpus=())
            if not existing.assumed:
                raise SchedulingError(
                    Status(
                        Code.ERROR,
                        (f"pod {pod.key} is already bound to node {existing.node}; not reserving {node}",),
                    )
                )
            self._drop(existing)
        constraints = self._constraints(pod)
        slot = self.state.slot_of.get(node)
        if slot is None:
            raise SchedulingError(
                Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, (f"node {node}: {_UNKNOWN_NODE}",))
            )
        result = self._fit(np.array([slot], dtype=np.intp), constraints)
        record = self._nodes[node]
        if not result.feasible[0]:
            reason = explain(
                state=self.state, labels=self.labels, record=record, slot=slot, constraints=constraints
            )
            code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE if reason.unresolvable else Code.UNSCHEDULABLE
            raise SchedulingError(Status(code, (f"node {node}: {reason.text}",)))
        allocation = self._choose(record, slot, result, constraints)
        if existing is None:
            self._tell_policies(constraints.demand)
        self._place(
            PodRecord(request=pod, node=node, allocation=allocation, assumed=True, assumed_at=self.clock())
        )
        return allocation

    def unreserve(self, uid: PodUID) -> None:
        record = self._pods.get(uid)
        if record is not None and record.assumed:
            self._drop(record)

    def confirm(self, uid: PodUID) -> None:
        record = self._pods.get(uid)
        if record is not None:
            record.assumed = False

    def expire_assumed(self) -> list[PodUID]:
        now = self.clock()
        expired = [
            uid
            for uid, record in self._pods.items()
            if record.assumed and now - record.assumed_at >= self.assume_ttl_s
        ]
        for uid in expired:
            self._drop(self._pods[uid])
        return expired

    # --- views -------------------------------------------------------------------

    def node_views(self, names_: Sequence[NodeName] | None = None) -> list[NodeView]:
        wanted = sorted(self._nodes) if names_ is None else list(names_)
        return [
            views.node_view(record)
            for name in wanted
            if (record := self._nodes.get(name)) is not None and record.devices is not None
        ]

    def allocation_of(self, uid: PodUID) -> tuple[NodeName, Allocation] | None:
        record = self._pods.get(uid)
        if record is None or record.allocation is None:
            return None
        return record.node, record.allocation

    def job_models(self) -> dict[str, str]:
        """Job key -> the GPU model its pods are held to."""
        return self._jobs.jobs()

    def pod_uids(self) -> list[PodUID]:
        """Every pod the core counts (bound and assumed)."""
        return list(self._pods)

    def is_assumed(self, uid: PodUID) -> bool:
        record = self._pods.get(uid)
        return record is not None and record.assumed

    # --- internals ---------------------------------------------------------------

    def _record(self, name: NodeName) -> NodeRecord:
        record = self._nodes.get(name)
        if record is None:
            record = self._nodes[name] = NodeRecord(name=name, require_info=self._require_node_info)
            slot = self.state.slot(name)
            self.labels.set_labels(slot, {names.NODE_NAME_FIELD: name})
        return record

    def _refresh(self, record: NodeRecord) -> None:
        write_node_row(self.state, record, self.state.slot_of[record.name])

    def _forget_if_unused(self, record: NodeRecord) -> None:
        if record.unused:
            slot = self.state.slot_of[record.name]
            self.labels.clear(slot)
            del self._nodes[record.name]
            self.state.release(record.name)

    def _place(self, pod: PodRecord) -> None:
        self._pods[pod.request.uid] = pod
        record = self._record(pod.node)
        record.pods[pod.request.uid] = pod
        self._jobs.join(pod.request.job_key, pod.request.uid, self._model_of(record, pod.allocation))
        self._refresh(record)

    def _drop(self, pod: PodRecord) -> None:
        uid = pod.request.uid
        self._pods.pop(uid, None)
        self._jobs.leave(pod.request.job_key, uid)
        record = self._nodes.get(pod.node)
        if record is None:
            return
        record.pods.pop(uid, None)
        self._refresh(record)
        self._forget_if_unused(record)

    @staticmethod
    def _model_of(record: NodeRecord, allocation: Allocation | None) -> str | None:
        if not allocation:
            return None
        for share in allocation.gpus:
            slot = record.share_slot(share)
            if slot is not None:
                return record.gpus[slot].model_label
        return None

    def _constraints(self, pod: PodRequest) -> Constraints:
        if pod.topology_scope not in SCOPES:
            raise SchedulingError(
                Status(
                    Code.ERROR,
                    (
                        f"pod {pod.key}: topology scope {pod.topology_scope!r} is not one of {', '.join(SCOPES[1:])}",
                    ),
                )
            )
        job_model = self._jobs.model_of(pod.job_key)
        return Constraints(
            demand=demand_of(pod),
            allowed_models=model_table(self.state, pod, job_model),
            job_model=job_model,
            pod=pod,
        )

    def _best(self, result: FitResult, constraints: Constraints) -> int | None:
        ok = result.feasible
        if not ok.any():
            return None
        slots = result.slots[ok]
        scores = np.asarray(
            self.node_policy.score(slots, constraints.demand, result.fits[ok]), dtype=np.float64
        )
        top = slots[scores >= scores.max() - 1e-9]
        if len(top) == 1:
            return int(top[0])
        return int(top[np.argmin(self.order.tie_ranks()[top])])

    def _choose(
        self, record: NodeRecord, slot: int, result: FitResult, constraints: Constraints
    ) -> Allocation:
        demand = constraints.demand
        if not demand.wants_gpu:
            return Allocation(gpus=())
        fits_row = result.fits[0]
        mem_total = self.state.mem_total[slot].tolist()
        # A pod's cards are all of one model: on a node that mixes models, try each that fits.
        groups = [fits_row]
        if demand.gpus > 1 and self.state.mixed_models[slot]:
            models = self.state.model_id[slot]
            fitting_models = models_that_fit(self.state, slot, fits_row, constraints.scope, demand.gpus)
            groups = [fits_row & (models == model) for model in fitting_models]
        if demand.gpus > 1 and not demand.whole and constraints.scope in SCOPE_GROUPS:
            # The filter only promised the cards fit inside one group: pick them from one.
            groups = [
                part
                for group in groups
                for part in scope_groups_that_fit(self.state, slot, group, constraints.scope, demand.gpus)
            ]
        chosen: list[int] | None = None
        for group in groups:
            fitting = np.flatnonzero(group)
            if demand.whole:
                chosen = gpuchoice.choose_whole(
                    record.topology, fitting.tolist(), demand.gpus, constraints.scope
                )
            elif len(fitting) >= demand.gpus:
                chosen = gpuchoice.choose_shares(
                    policy=self.gpu_policy, node=slot, demand=demand, fitting=fitting
                )
            if chosen is not None:
                return gpuchoice.share_allocation(record, demand, chosen, mem_total)
        if not demand.whole and result.mig is not None:
            mig = gpuchoice.choose_mig(record, demand, np.flatnonzero(result.mig[0]).tolist())
            if mig is not None:
                return mig
        raise SchedulingError(Status(Code.UNSCHEDULABLE, (f"node {record.name}: no GPU set fits the pod",)))


def _implements_core(scheduler: Scheduler) -> Core:
    # mypy checks here that Scheduler satisfies the Core protocol adapters code against.
    return scheduler
