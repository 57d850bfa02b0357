"""Counting a bound pod into the core from what is written on it, trusting only what verifies.

A bound pod's GPUs are whatever its `device-allocated` annotation says, not
what its request would get today: the rules may have changed, the pod may
predate them. So the allocation is read from the annotation, the request only
supplies CPU/memory and the job key, and a pod whose request no longer parses
still has its GPUs counted. An allocation naming a GPU its node does not
report is returned as an orphan line (for a log line and a metric), and still
counted, so it is never silently dropped.

Anyone who may edit a pod can edit that annotation, or create a pod with
`spec.nodeName` and an annotation of their own. So an allocation is counted as
written only when its signature verifies for this pod and node. For a bound
pod whose allocation does not verify (unsigned, edited, signed for another pod
or node, unreadable, or removed) the scheduler counts, in this order:

1. its **last verified allocation**, when this process knows one (its own
   bind, or an earlier verified view of the pod): an edit changes nothing, so
   editing a running pod down to 1% frees nothing;
2. else its **request**, on the GPUs the annotation names that the node
   reports, at most one entry per GPU and as many GPUs as the request asks
   for, each cut to what the other pods leave free. The request is what the
   pod could hold had it been placed (and what ResourceQuota bounds), so a
   forged pod blocks no more than a real pod with that request, and 5,000
   entries or a 10^30-byte one count as at most the request;
3. else **nothing**: the pod requests no GPU, so the node gives it none.

Why (2) and not "nothing": a pod edited while no scheduler was watching (then
restarted) most likely still runs where it was placed, and the pod author
can only move its claim, not grow it. Why not "as written": that is the attack.
Cutting (2) to what is free means an unverified pod never makes a GPU look
over-allocated; when a verified pod arrives on its GPU (placed by another
leader), the cut shrinks rather than the GPU overflowing.

Without verifying keys (`verify` None: `fgpuctl inspect` given none) nothing
can be checked: allocations are counted as written, one entry per GPU and no
more memory than the GPU has, so a flood cannot overflow the arrays either.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from apis import names
from apis.allocation import Allocation, AllocationError, GPUShare, decode_allocation, share_memory_bytes
from apis.devices import GPUInfo, NodeDevices
from apis.signing import SignatureError
from apis.translation import TranslationRules
from scheduler_plugin import pods
from scheduler_plugin.core.api import Core, NodeName, PodRequest, PodUID
from scheduler_plugin.core.demand import FULL_PERCENT, demand_of

log = logging.getLogger(__name__)


class Verifier(Protocol):
    """`apis.signing.verify_pod_annotations` with the keys bound: the allocation, None for none, or it raises."""

    def __call__(self, *, pod_uid: str, node_name: str, annotations: Mapping[str, str]) -> Allocation | None: ...


class Basis(enum.Enum):
    """What is counted for a bound pod whose allocation does not verify (rules 1-3 above)."""

    LAST_VERIFIED = "last-verified"
    REQUEST = "request"
    NOTHING = "nothing"


@dataclass(frozen=True)
class Unverified:
    """A bound pod whose allocation does not verify, and what is counted for it instead."""

    uid: PodUID
    namespace: str
    name: str
    node: NodeName
    #: why it does not verify, as the verifier said it
    problem: str
    basis: Basis
    #: what the core counts for it now (REQUEST: after the cut to what is free)
    counted: Allocation

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def involved_object(self) -> dict[str, Any]:
        """The pod, as much of it as an Event about it needs."""
        return {"metadata": {"namespace": self.namespace, "name": self.name, "uid": self.uid}}

    def message(self) -> str:
        """One line for the Event, the log and `fgpuctl inspect`."""
        return (
            f"the {names.DEVICE_ALLOCATED} annotation of pod {self.key} on node {self.node} does not verify "
            f"({self.problem}); {_BASIS_TEXT[self.basis]}. Fix: restore the annotations fgpu-scheduler wrote, "
            "or delete the pod so that it is scheduled and signed again"
        )


_BASIS_TEXT = {
    Basis.LAST_VERIFIED: "fgpu-scheduler keeps counting the allocation it last verified for this pod, so the change frees nothing",
    Basis.REQUEST: (
        "no verified allocation of this pod is known, so its request is counted instead, on the GPUs the annotation "
        "names that the node has, within what the other pods leave free"
    ),
    Basis.NOTHING: "the pod requests no GPU, so no GPU is counted for it",
}


def gpu_uuids(devices: NodeDevices) -> frozenset[str]:
    """Every GPU and MIG instance UUID a node reports."""
    out: set[str] = set()
    for gpu in devices.gpus:
        out.add(gpu.uuid)
        out.update(m.uuid for m in gpu.mig_instances)
    return frozenset(out)


class History:
    """What this process verified and reported, by pod uid; it outlives rebuilds of the core (resync)."""

    def __init__(self) -> None:
        self._verified: dict[PodUID, tuple[NodeName, Allocation]] = {}
        self._reported: dict[PodUID, tuple[str, Basis]] = {}

    def remember(self, uid: PodUID, node: NodeName, allocation: Allocation) -> None:
        """`allocation` verified for `uid` on `node` (or this scheduler signed it there)."""
        if allocation.gpus:
            self._verified[uid] = (node, allocation)

    def recall(self, uid: PodUID, node: NodeName) -> Allocation | None:
        known = self._verified.get(uid)
        return known[1] if known is not None and known[0] == node else None

    def forget(self, uid: PodUID) -> None:
        self._verified.pop(uid, None)
        self._reported.pop(uid, None)

    def first_report(self, found: Unverified) -> bool:
        """True once per pod and (problem, basis): an informer update of the same pod is not news."""
        seen = (found.problem, found.basis)
        if self._reported.get(found.uid) == seen:
            return False
        self._reported[found.uid] = seen
        return True

    def verified_again(self, uid: PodUID) -> None:
        self._reported.pop(uid, None)


@dataclass(frozen=True)
class _Claimed:
    """A REQUEST-basis pod: its request and the shares its annotation claims, cut again whenever its node changes."""

    request: PodRequest
    node: NodeName
    claims: tuple[GPUShare, ...]


class BoundPods:
    """The bound pods of one core, each counted by the rule of the module docstring."""

    def __init__(self, core: Core, *, verify: Verifier | None, history: History) -> None:
        self._core = core
        self._verify = verify
        self.history = history
        #: node of every pod counted through here, so that a removal knows whose cuts to redo
        self._nodes: dict[PodUID, NodeName] = {}
        self._claimed: dict[PodUID, _Claimed] = {}
        self._unverified: dict[PodUID, Unverified] = {}
        self._news: list[Unverified] = []

    def add(self, pod: Mapping[str, Any], *, gpus: Mapping[str, frozenset[str]], rules: TranslationRules | None) -> list[str]:
        """Counts `pod` (assigned to a node); returns orphan lines for GPUs its node lacks."""
        uid = pods.uid(pod)
        node = NodeName(pods.node_name(pod))
        request, problem = pods.request_of_bound(pod, rules=rules)
        if problem:
            log.warning("bound pod %s: request not valid under current rules (%s); counting its allocation only", pods.key(pod), problem)
        annotations = pods.annotations_of(pod)
        self._nodes[uid] = node
        was_claimed = self._claimed.pop(uid, None) is not None
        self._unverified.pop(uid, None)
        if self._verify is None:
            allocation = self._unchecked(annotations.get(names.DEVICE_ALLOCATED), node)
            self._core.add_pod(request, node, allocation)
            self.recount(node)
            return _orphans(pod, node, allocation, gpus)
        try:
            allocation = self._verify(pod_uid=uid, node_name=node, annotations=annotations)
            trouble = ""
            if allocation is None and self.history.recall(uid, node) is not None:
                trouble = f"the {names.DEVICE_ALLOCATED} annotation was removed"
        except (SignatureError, AllocationError) as exc:
            allocation, trouble = None, str(exc)
        if not trouble:
            if allocation is not None:
                self.history.remember(uid, node, allocation)
                self.history.verified_again(uid)
            elif was_claimed:
                # Its cut was never verified: with the claim gone, nothing of it is counted (None would keep the cut).
                allocation = Allocation(gpus=())
            self._core.add_pod(request, node, allocation)
            self.recount(node)
            return _orphans(pod, node, allocation, gpus)
        return self._add_unverified(pod, request, node, annotations, trouble, gpus)

    def remove(self, uid: PodUID) -> None:
        """Forgets a pod (deleted, finished, released); the unverified pods of its node are cut again."""
        self._core.remove_pod(uid)
        self.history.forget(uid)
        self._claimed.pop(uid, None)
        self._unverified.pop(uid, None)
        node = self._nodes.pop(uid, None)
        if node is not None:
            self.recount(node)

    def recount(self, node: NodeName) -> None:
        """Cuts the REQUEST-basis pods of `node` again to what the other pods leave free (in uid order)."""
        claimed = sorted((uid, c) for uid, c in self._claimed.items() if c.node == node)
        if not claimed:
            return
        views = self._core.node_views([node])
        gpus = {g.device.uuid: g.device for view in views for g in view.gpus}
        core_used = {g.device.uuid: g.allocated_core_percent for view in views for g in view.gpus}
        memory_used = {g.device.uuid: g.allocated_memory_bytes for view in views for g in view.gpus}
        others = {p.uid for view in views for g in view.gpus for p in g.pods} - {uid for uid, _ in claimed}
        migs_used = {s.mig_uuid for uid in others if (held := self._core.allocation_of(uid)) for s in held[1].gpus if s.mig_uuid}
        for uid, _ in claimed:  # their own current cut is not "used by others"
            held = self._core.allocation_of(uid)
            for share in held[1].gpus if held else ():
                if share.uuid in gpus and not share.mig_uuid:
                    core_used[share.uuid] -= share.core_percent
                    memory_used[share.uuid] -= share_memory_bytes(share, gpu_memory_bytes=gpus[share.uuid].memory_bytes)
        for uid, c in claimed:
            cut = _cut(c, gpus=gpus, core_used=core_used, memory_used=memory_used, migs_used=migs_used)
            self._core.add_pod(c.request, node, cut)
            self._unverified[uid] = replace(self._unverified[uid], counted=cut)

    def unverified(self) -> tuple[Unverified, ...]:
        return tuple(sorted(self._unverified.values(), key=lambda u: (u.node, u.key)))

    @property
    def unverified_count(self) -> int:
        return len(self._unverified)

    def take_news(self) -> list[Unverified]:
        """Pods found unverified (or unverified in a new way) since the last call, for an Event each."""
        news, self._news = self._news, []
        return [self._unverified.get(u.uid, u) for u in news]

    def _add_unverified(
        self,
        pod: Mapping[str, Any],
        request: PodRequest,
        node: NodeName,
        annotations: Mapping[str, str],
        trouble: str,
        gpus: Mapping[str, frozenset[str]],
    ) -> list[str]:
        uid = request.uid
        last = self.history.recall(uid, node)
        counted = Allocation(gpus=())
        orphans: list[str] = []
        if last is not None:
            basis, counted = Basis.LAST_VERIFIED, last
            self._core.add_pod(request, node, last)
            orphans = _orphans(pod, node, last, gpus)
        elif request.device is not None:
            basis = Basis.REQUEST
            self._claimed[uid] = _Claimed(request=request, node=node, claims=_claims(annotations.get(names.DEVICE_ALLOCATED)))
        else:
            basis = Basis.NOTHING
            self._core.add_pod(request, node, None)
        meta = pods.meta(pod)
        found = Unverified(
            uid=uid,
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            node=node,
            problem=trouble,
            basis=basis,
            counted=counted,
        )
        self._unverified[uid] = found
        self.recount(node)
        if self.history.first_report(found):
            self._news.append(found)
        return orphans

    def _unchecked(self, text: str | None, node: NodeName) -> Allocation | None:
        if not text:
            return None
        gpus = {g.device.uuid: g.device for view in self._core.node_views([node]) for g in view.gpus}
        shares = []
        for share in _claims(text):
            gpu = gpus.get(share.uuid)
            if gpu is not None:
                shares.append(replace(share, memory_bytes=min(share_memory_bytes(share, gpu_memory_bytes=gpu.memory_bytes), gpu.memory_bytes), memory_ratio_percent=0))
            else:
                shares.append(replace(share, memory_bytes=0, memory_ratio_percent=0))  # reported as an orphan, never counted
        return Allocation(gpus=tuple(shares))


def _claims(text: str | None) -> tuple[GPUShare, ...]:
    """The shares an annotation names, at most one per GPU or MIG instance (a flood collapses here)."""
    if not text:
        return ()
    try:
        allocation = decode_allocation(text)
    except AllocationError:
        return ()
    seen: set[tuple[str, str, int]] = set()
    out = []
    for share in allocation.gpus:
        key = (share.mig_uuid, share.uuid, share.minor if not share.uuid else -1)
        if key not in seen:
            seen.add(key)
            out.append(share)
    return tuple(out)


def _cut(
    claimed: _Claimed,
    *,
    gpus: Mapping[str, GPUInfo],
    core_used: dict[str, int],
    memory_used: dict[str, int],
    migs_used: set[str],
) -> Allocation:
    """The request of `claimed` on the GPUs it claims, each share cut to what is still free (updating the usage)."""
    demand = demand_of(claimed.request)
    by_minor = {g.minor: g for g in gpus.values()}
    migs = {m.uuid: (g, m) for g in gpus.values() if g.mig_enabled for m in g.mig_instances}
    out: list[GPUShare] = []
    taken: set[str] = set()
    for share in claimed.claims:
        if len(out) >= demand.gpus:
            break
        if share.mig_uuid:
            found = migs.get(share.mig_uuid)
            if found is None or share.mig_uuid in migs_used:
                continue
            gpu, instance = found
            migs_used.add(instance.uuid)
            out.append(GPUShare(gpu.minor, gpu.uuid, demand.core_percent, instance.memory_bytes, 0, instance.uuid))
            continue
        located = gpus.get(share.uuid) if share.uuid else by_minor.get(share.minor)
        if located is None or located.mig_enabled or located.uuid in taken:
            continue
        uuid = located.uuid
        core = min(demand.core_need(), max(0, FULL_PERCENT - core_used.get(uuid, 0)))
        memory = min(demand.memory_need_on(located.memory_bytes), max(0, located.memory_bytes - memory_used.get(uuid, 0)))
        if core == 0 and memory == 0:
            continue
        taken.add(uuid)
        core_used[uuid] = core_used.get(uuid, 0) + core
        memory_used[uuid] = memory_used.get(uuid, 0) + memory
        out.append(GPUShare(located.minor, uuid, core, memory, 0))
    return Allocation(gpus=tuple(out))


def _orphans(pod: Mapping[str, Any], node: NodeName, allocation: Allocation | None, gpus: Mapping[str, frozenset[str]]) -> list[str]:
    if allocation is None or node not in gpus:
        return []
    return [
        f"{pods.key(pod)}: {uuid} (node {node} has no such GPU)"
        for share in allocation.gpus
        if (uuid := share.mig_uuid or share.uuid) and uuid not in gpus[node]
    ]
