"""The scheduler service: one object that every adapter calls, around the decision core.

The gRPC servicer, the kube-scheduler extender and the standalone loop all
turn their input into a pod dict and call this; the backends feed it state.
It holds the core behind one lock (the core is plain, single-threaded data),
signs allocations, makes binds durable through the backend, and records
metrics and Events. I/O (the backend's bind) happens outside the lock, so a
slow API server delays one bind, not every filter.

A bind is reserve (under the lock) -> backend.bind (no lock) -> count the pod
as bound (add_pod, which also re-adds it if the reservation expired or was
dropped meanwhile). If the backend says the bind failed, the reservation is
released; if it says the pod is bound elsewhere (Conflict), the pod is re-read
and counted where it is bound, with the allocation it carries; if it cannot
tell (Unavailable), the reservation stays assumed: either the pod shows up
bound through the backend's feed (and is counted from its annotation), or the
reservation expires, and a retry reuses the reservation rather than choosing
again. A GPU is therefore never counted twice, nor lost.

While a bind of a pod is in flight, or its outcome is unknown and its
reservation still held, a reserve or bind of that pod for another node is
refused (Conflict, retryable): moving the reservation would free GPUs that
the first Binding may still take, and a third pod could be given them.
kube-scheduler does exactly that when an extender bind outlives its
httpTimeout: it retries the pod, perhaps on another node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from apis import names
from apis.allocation import Allocation, AllocationError
from apis.device_object import check_unique_uuids
from apis.devices import DeviceError, NodeDevices
from apis.request import RequestError
from apis.signing import SchedulerKeys, allocation_annotations, verify_pod_annotations
from apis.translation import TranslationRules
from scheduler_plugin import boundpods, cluster_gauges, pods
from scheduler_plugin.allocation_split import with_containers
from scheduler_plugin.backend import Backend, Snapshot
from scheduler_plugin.core.api import (
    Core,
    NodeInfo,
    NodeName,
    NodeVerdict,
    NodeView,
    PodRequest,
    PodUID,
    SchedulingError,
)
from scheduler_plugin.errors import Conflict, InvalidRequest, NotLeader, Unavailable, Unschedulable
from scheduler_plugin.events import EventRecorder, summarize
from scheduler_plugin.metrics import Metrics, Phase, Result

log = logging.getLogger(__name__)

CoreFactory = Callable[[], Core]
RulesSource = Callable[[], TranslationRules | None]


class PendingSink(Protocol):
    """The standalone loop's queue, as the state feed sees it."""

    def add(self, pod: Mapping[str, Any]) -> None: ...

    def discard(self, uid: str) -> None: ...

    def all_due_now(self) -> None: ...


@runtime_checkable
class NodeObjectsCore(Protocol):
    """A core that can make a node's Node facts a condition of scheduling on it (`Scheduler`)."""

    require_node_info: bool


@dataclass(frozen=True)
class SignedAllocation:
    node: NodeName
    allocation: Allocation
    annotations: Mapping[str, str]

    @property
    def annotation(self) -> str:
        """Empty for a pod without GPUs, which carries no allocation."""
        return self.annotations.get(names.DEVICE_ALLOCATED, "")

    @property
    def signature(self) -> str:
        return self.annotations.get(names.ALLOCATION_SIGNATURE, "")


@dataclass(frozen=True)
class FilterOutcome:
    verdicts: tuple[NodeVerdict, ...]
    #: non-empty when the pod itself is invalid; then every verdict carries it
    pod_error: str = ""


class SchedulingService:
    def __init__(
        self,
        *,
        core_factory: CoreFactory,
        backend: Backend,
        signing_key: SchedulerKeys | None,
        rules: RulesSource = lambda: None,
        metrics: Metrics | None = None,
        recorder: EventRecorder | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        verify: boundpods.Verifier | None = None,
    ) -> None:
        """`verify` checks bound pods' allocations; by default with `signing_key` (None: nothing is checked)."""
        self._core_factory = core_factory
        self._core = core_factory()
        #: what this process verified and reported, by pod uid (outlives resyncs)
        self._history = boundpods.History()
        self._verify = verify or _verifier(signing_key)
        self._bound_pods = boundpods.BoundPods(self._core, verify=self._verify, history=self._history)
        self._backend = backend
        self._key = signing_key
        self._rules = rules
        self.metrics = metrics or Metrics()
        self.metrics.unverified_allocations.set_function(lambda: self._bound_pods.unverified_count)
        self._recorder = recorder
        self._is_leader = is_leader
        self._lock = threading.RLock()
        self._loaded = False
        #: node -> GPU uuids it has, for reporting allocations on vanished GPUs
        self._gpus: dict[str, frozenset[str]] = {}
        #: where pending pods addressed to us go (the standalone loop's queue)
        self.pending: PendingSink | None = None
        #: GPU pods waiting for fgpu, in either mode, for the pending gauges
        self._pending_gpu = cluster_gauges.PendingGPUPods()
        self.metrics.pending_gpu_pods.set_function(lambda: self._pending_gpu.count())
        self.metrics.oldest_pending_gpu_pod.set_function(lambda: self._pending_gpu.oldest_age_s(time.time()))
        #: orphan lines reported since start (also logged and counted)
        self.orphans: list[str] = []
        self._reported: set[str] = set()
        #: uid -> node of every pod known to be bound (GPU or not); the core's
        #: allocation_of only knows pods holding GPUs
        self._bound: dict[str, NodeName] = {}
        #: uid -> (node, how many binds) of binds in flight: the pod may land there any moment
        self._binding: dict[str, tuple[NodeName, int]] = {}
        #: uids whose last bind's outcome is unknown (Unavailable): it may land while the reservation lasts
        self._unsettled: set[str] = set()
        #: uids the feed saw deleted (or finished) while a bind of theirs was in flight: that bind,
        #: coming back, must not count them again
        self._gone_while_binding: set[str] = set()
        #: a node exists only while its Node object does (require_node_objects)
        self._nodes_need_objects = False
        #: the last Node facts and devices fed per node, to tell a change that may make room
        #: (the standalone queue then retries its waiting pods) from a repeat of what is known
        self._infos: dict[str, NodeInfo] = {}
        self._devices: dict[str, NodeDevices] = {}

    # --- decisions ----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._loaded

    @property
    def leading(self) -> bool:
        return self._is_leader()

    def request(self, pod: Mapping[str, Any]) -> PodRequest:
        try:
            return pods.request_of(pod, rules=self._rules())
        except RequestError:
            raise
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(f"pod {pods.key(pod)}: {exc}") from exc

    def filter(
        self, pod: Mapping[str, Any], node_names: Sequence[str] | None = None, *, request: PodRequest | None = None
    ) -> FilterOutcome:
        """Verdicts for `node_names` (all nodes when None; none for an empty list, as kube-scheduler's
        extender protocol reads it). `request`: the pod already parsed, if the caller has it."""
        self._require_loaded()
        if node_names is not None and not node_names:
            # No candidate: nothing to judge. Never "every node": kube-scheduler refuses an answer
            # that names a node it did not send.
            return FilterOutcome(verdicts=())
        with self.metrics.timed(Phase.FILTER):
            try:
                request = request or self.request(pod)
            except RequestError as exc:
                message = "; ".join(exc.errors) or str(exc)
                verdicts = tuple(NodeVerdict(NodeName(n), False, message, unresolvable=True) for n in node_names or ())
                return FilterOutcome(verdicts=verdicts, pod_error=message)
            nodes = None if node_names is None else [NodeName(n) for n in node_names]
            with self._lock:
                verdicts = tuple(self._core.filter(request, nodes))
        self.metrics.record_reasons([v.reason for v in verdicts if not v.feasible])
        return FilterOutcome(verdicts=verdicts)

    def score(
        self, pod: Mapping[str, Any], node_names: Sequence[str], *, request: PodRequest | None = None
    ) -> list[tuple[NodeName, int]]:
        self._require_loaded()
        request = request or self.request(pod)
        with self.metrics.timed(Phase.SCORE), self._lock:
            return list(self._core.score(request, [NodeName(n) for n in node_names]))

    def score_and_choose(
        self, pod: Mapping[str, Any], node_names: Sequence[str], *, request: PodRequest | None = None
    ) -> tuple[list[tuple[NodeName, int]], NodeName | None]:
        """The scores of `node_names` and the one the scheduler itself would pick (scores, then its
        tie-break order), from one view of the cluster."""
        self._require_loaded()
        request = request or self.request(pod)
        names_ = [NodeName(n) for n in node_names]
        with self.metrics.timed(Phase.SCORE), self._lock:
            return list(self._core.score(request, names_)), self._core.select(request, names_)

    def reserve(self, pod: Mapping[str, Any], node: str) -> SignedAllocation:
        self._require_leader()
        request = self.request(pod)
        with self.metrics.timed(Phase.RESERVE), self._lock:
            allocation = self._reserve_locked(request, NodeName(node))
        return self._signed(pod, request.uid, NodeName(node), allocation)

    def unreserve(self, pod: Mapping[str, Any]) -> bool:
        """Releases a reservation; for the embedded backend also a bound pod. True when a bound pod was released."""
        uid = pods.uid(pod)
        with self._lock:
            self._core.unreserve(uid)
        released = self._backend.release(uid)
        if released:
            with self._lock:
                self._bound.pop(uid, None)
                self._bound_pods.remove(uid)
        return released

    def bind(self, pod: Mapping[str, Any], node: str) -> SignedAllocation:
        """Reserves (unless reserved on `node` already), writes the signed allocation and binds."""
        self._require_leader()
        request = self.request(pod)
        target = NodeName(node)
        with self.metrics.timed(Phase.RESERVE), self._lock:
            allocation = self._reserve_locked(request, target)
            self._binding_started(request.uid, target)  # under the same lock: no reserve elsewhere in between
        try:
            signed = self._signed(pod, request.uid, target, allocation)
            with self.metrics.timed(Phase.BIND):
                try:
                    self._backend.bind(pod=pod, node=target, annotations=signed.annotations)
                except Unavailable:
                    # Outcome unknown: keep the reservation (see module docstring).
                    self.metrics.bind_failures.labels(step="unknown").inc()
                    with self._lock:
                        if request.uid not in self._gone_while_binding:
                            self._unsettled.add(request.uid)
                    raise
                except Conflict:
                    self.metrics.bind_failures.labels(step="bind").inc()
                    self._count_bound_elsewhere(request)
                    raise
                except Exception:
                    self.metrics.bind_failures.labels(step="bind").inc()
                    with self._lock:
                        self._core.unreserve(request.uid)
                    raise
            with self._lock:
                self._unsettled.discard(request.uid)
                if request.uid in self._gone_while_binding:
                    # The feed saw the pod bound and then deleted before this call came back:
                    # counting it now would hold its GPUs for a pod that no longer exists.
                    log.info("pod %s was deleted while its bind was answering; not counted", request.key)
                    self._core.unreserve(request.uid)
                    return signed
                # Not confirm(): the reservation may have expired or been dropped
                # (Unreserve, resync) while the bind ran; add_pod counts the pod either way.
                self._core.add_pod(request, target, allocation)
                self._bound[request.uid] = target
                if signed.annotations:
                    self._history.remember(request.uid, target, signed.allocation)
            return signed
        finally:
            with self._lock:
                self._binding_ended(request.uid)

    def place(self, pod: Mapping[str, Any]) -> tuple[NodeName, Allocation] | None:
        """Filter + score + tie-break over every node, then reserve on the best: one decision, no I/O.

        Returns None when no node fits. Raises RequestError for an invalid pod.
        """
        self._require_leader()
        return self._place(self.request(pod))

    def _place(self, request: PodRequest) -> tuple[NodeName, Allocation] | None:
        with self._lock:
            held = self._core.allocation_of(request.uid)
            if held is not None:
                # A retry (say after a bind whose answer was lost): the pod's own
                # reservation fills its node, so select() would move it elsewhere.
                return held
            with self.metrics.timed(Phase.FILTER):
                chosen = self._core.select(request)
            if chosen is None:
                return None
            with self.metrics.timed(Phase.RESERVE):
                return chosen, self._reserve_locked(request, chosen)

    def schedule(self, pod: Mapping[str, Any]) -> SignedAllocation | None:
        """The standalone path: choose a node, bind, and tell the pod (Event) either way.

        Returns None when the pod cannot be placed now (an Event says why).
        Raises Unavailable/NotLeader/Conflict for the caller to retry or drop.
        """
        self._require_leader()
        try:
            request = self.request(pod)
        except (RequestError, InvalidRequest) as exc:
            self.metrics.decisions.labels(result=Result.ERROR.value).inc()
            self._event_failed(pod, summarize((), pod_error=_describe(exc)))
            return None
        with self._lock:
            placed = self._place(request)
            if placed is None:
                verdicts = self._core.filter(request)
        if placed is None:
            self.metrics.decisions.labels(result=Result.UNSCHEDULABLE.value).inc()
            self.metrics.record_reasons([v.reason for v in verdicts if not v.feasible])
            self._event_failed(pod, summarize(verdicts))
            return None
        chosen = placed[0]
        try:
            signed = self.bind(pod, chosen)  # finds the reservation place() made
        except Unschedulable as exc:
            self.metrics.decisions.labels(result=Result.UNSCHEDULABLE.value).inc()
            self._event_failed(pod, f"node {chosen}: {exc}")
            return None
        self.metrics.decisions.labels(result=Result.SCHEDULED.value).inc()
        gpus = ", ".join(f"{g.uuid} ({g.core_percent}% core, {g.memory_bytes} bytes)" for g in signed.allocation.gpus)
        self._event(pod, f"Successfully assigned {pods.key(pod)} to {chosen}" + (f"; GPUs {gpus}" if gpus else ""), failed=False)
        return signed

    def report_devices(self, devices: NodeDevices) -> list[str]:
        try:
            check_unique_uuids(devices, what=f"report of node {devices.node_name}", places=_report_places(devices))
        except DeviceError as exc:
            raise InvalidRequest(str(exc)) from exc
        self._backend.store_devices(devices)
        return self.on_devices_lines(devices)

    def get_pod(self, *, namespace: str, name: str) -> dict[str, Any] | None:
        return self._backend.get_pod(namespace=namespace, name=name)

    def node_views(self, names_: Sequence[str] | None = None) -> list[NodeView]:
        with self._lock:
            return list(self._core.node_views([NodeName(n) for n in names_] if names_ else None))

    def allocation_of(self, uid: str) -> tuple[NodeName, Allocation] | None:
        with self._lock:
            return self._core.allocation_of(PodUID(uid))

    def tick(self, *, refresh_gauges: bool = True) -> list[PodUID]:
        """Housekeeping: expires stale reservations; refreshes the allocation gauges when asked."""
        with self._lock:
            expired = self._core.expire_assumed()
            views = self._core.node_views(None) if refresh_gauges else []
            fragmentation = cluster_gauges.fragmentation_by_model(self._core, views) if refresh_gauges else {}
        for uid in expired:
            log.warning("reservation of pod %s expired: bind never came", uid)
        if refresh_gauges:
            self.metrics.set_allocation(views)
            self.metrics.set_fragmentation(fragmentation)
        return expired

    # --- state feed (StateSink) --------------------------------------------------------

    def require_node_objects(self) -> None:
        """A node takes pods only while its Node object exists (called by the kubernetes backend).

        There a Device outlives its deleted Node until the garbage collector removes it, and any
        relist in between would otherwise make the node schedulable again.
        """
        with self._lock:
            self._nodes_need_objects = True
            self._configure(self._core)

    def load(self, snapshot: Snapshot) -> None:
        with self.metrics.timed(Phase.REBUILD):
            core = self._configure(self._core_factory())
            gpus: dict[str, frozenset[str]] = {}
            orphans: list[str] = []
            devices_fed: dict[str, NodeDevices] = {}
            for devices in snapshot.devices:
                try:
                    orphans.extend(core.upsert_node_devices(devices))
                except DeviceError as exc:
                    log.error("devices of node %s ignored until fixed: %s", devices.node_name, exc)
                    continue
                gpus[devices.node_name] = boundpods.gpu_uuids(devices)
                devices_fed[devices.node_name] = devices
            for info in snapshot.nodes:
                core.upsert_node_info(info)
            bound: dict[str, NodeName] = {}
            bound_pods = boundpods.BoundPods(core, verify=self._verify, history=self._history)
            for pod in snapshot.pods:
                if pods.holds_resources(pod):
                    orphans.extend(bound_pods.add(pod, gpus=gpus, rules=self._rules()))
                    bound[pods.uid(pod)] = NodeName(pods.node_name(pod))
            with self._lock:
                self._core = core
                self._bound_pods = bound_pods
                self._gpus = gpus
                self._bound = bound
                self._devices = devices_fed
                self._infos = {info.name: info for info in snapshot.nodes}
                self._loaded = True
        self._report_orphans(orphans)
        if self.pending is not None:
            self.pending.all_due_now()  # the new picture may have room the waiting pods did not see
        log.info("state rebuilt: %d nodes with devices, %d bound pods", len(snapshot.devices), len(snapshot.pods))

    def resync(self, backend: Backend) -> None:
        """Rebuilds from a fresh listing, holding the lock so no feed event lands in between and is lost."""
        with self._lock:
            self.load(backend.snapshot())

    def on_devices(self, devices: NodeDevices) -> None:
        self.on_devices_lines(devices)

    def on_devices_lines(self, devices: NodeDevices) -> list[str]:
        name = devices.node_name
        with self._lock:
            try:
                lines = self._core.upsert_node_devices(devices)
            except DeviceError as exc:
                # The node keeps what it had: an inventory listing a GPU twice would let its shares
                # pile up on one entry while the other looked free.
                log.error("devices of node %s ignored until fixed: %s", name, exc)
                return []
            self._gpus[name] = boundpods.gpu_uuids(devices)
            self._bound_pods.recount(NodeName(name))
            changed = self._devices.get(name) != devices
            self._devices[name] = devices
        self._report_orphans(lines)
        if changed:
            self._retry_pending()
        return lines

    def on_devices_removed(self, node: NodeName) -> None:
        # Bound pods on the node stay counted: the GPUs may come back, and
        # their allocations are reported as orphaned by the core's own view.
        with self._lock:
            if node not in self._gpus:
                # Its Node went first (the garbage collector's order) and took the node with it, or
                # its devices were never read: an empty report would bring back a node that is gone.
                return
            self._gpus[node] = frozenset()
            self._devices.pop(node, None)
            lines = self._core.upsert_node_devices(NodeDevices(node_name=node))
        self._report_orphans(lines)

    def on_node(self, info: NodeInfo) -> None:
        with self._lock:
            self._core.upsert_node_info(info)
            changed = self._infos.get(info.name) != info
            self._infos[info.name] = info
        if changed:
            # Added, uncordoned, relabelled, untainted, grown: waiting pods may fit now. A status
            # heartbeat reads as the same facts and retries nothing.
            self._retry_pending()

    def on_node_removed(self, node: NodeName) -> None:
        with self._lock:
            self._gpus.pop(node, None)
            self._infos.pop(node, None)
            self._devices.pop(node, None)
            self._core.remove_node(node)

    def on_pod(self, pod: Mapping[str, Any]) -> None:
        with self._lock:
            self._pending_gpu.observe(pod, rules=self._rules(), now=time.time())
        if pods.holds_resources(pod):
            if self.pending is not None:
                self.pending.discard(pods.uid(pod))
            with self._lock:
                orphans = self._bound_pods.add(pod, gpus=self._gpus, rules=self._rules())
                self._bound[pods.uid(pod)] = NodeName(pods.node_name(pod))
            self._report_orphans(orphans)
        elif pods.is_terminated(pod):
            self.on_pod_removed(pod)
        elif self.pending is not None:
            if pods.wants_us(pod):
                self.pending.add(pod)
            else:
                self.pending.discard(pods.uid(pod))

    def on_pod_removed(self, pod: Mapping[str, Any]) -> None:
        uid = pods.uid(pod)
        with self._lock:
            if uid in self._binding:
                self._gone_while_binding.add(uid)
            self._pending_gpu.forget(uid)
            held = self._core.allocation_of(uid) is not None
            self._bound.pop(uid, None)
            self._unsettled.discard(uid)
            self._core.unreserve(uid)
            self._bound_pods.remove(uid)
        if self._recorder is not None:
            self._recorder.forget(uid)
        if self.pending is not None:
            self.pending.discard(uid)
            if held:
                self.pending.all_due_now()

    # --- internals -----------------------------------------------------------------

    def _reserve_locked(self, request: PodRequest, node: NodeName) -> Allocation:
        if not request.uid:
            raise InvalidRequest(f"pod {request.key}: metadata.uid is required to reserve or bind (the signature covers it)")
        bound_to = self._bound.get(request.uid)
        if bound_to is not None and bound_to != node:
            raise Conflict(f"pod {request.key} (uid {request.uid}) is bound to node {bound_to} already, not {node}")
        binding = self._binding.get(request.uid)
        if binding is not None and binding[0] != node:
            raise Conflict(
                f"pod {request.key} (uid {request.uid}) is being bound to node {binding[0]} right now; not reserving it "
                f"on {node} meanwhile; retry once that bind has answered"
            )
        existing = self._core.allocation_of(request.uid)
        if existing is not None:
            if existing[0] == node:
                return existing[1]
            if request.uid in self._unsettled:
                raise Conflict(
                    f"pod {request.key} (uid {request.uid}): whether its bind to node {existing[0]} happened is not "
                    f"known yet; not moving it to {node} until the pod shows up bound or its reservation expires; retry"
                )
            self._core.unreserve(request.uid)
        self._unsettled.discard(request.uid)  # its reservation is gone (expired, resync): nothing left to hold
        try:
            return self._core.reserve(request, node)
        except SchedulingError as exc:
            raise Unschedulable(f"pod {request.key} does not fit on node {node}: {exc}") from exc

    def _binding_started(self, uid: str, node: NodeName) -> None:
        _, count = self._binding.get(uid, (node, 0))
        self._binding[uid] = (node, count + 1)

    def _binding_ended(self, uid: str) -> None:
        node, count = self._binding.get(uid, (NodeName(""), 1))
        if count > 1:
            self._binding[uid] = (node, count - 1)
        else:
            self._binding.pop(uid, None)
            self._gone_while_binding.discard(uid)

    def _configure(self, core: Core) -> Core:
        if self._nodes_need_objects:
            if isinstance(core, NodeObjectsCore):
                core.require_node_info = True
            else:
                log.warning("core %s cannot require Node objects; a Device alone makes a node", type(core).__name__)
        return core

    def _retry_pending(self) -> None:
        if self.pending is not None:
            self.pending.all_due_now()

    def _count_bound_elsewhere(self, request: PodRequest) -> None:
        """After a Conflict: counts the pod where it is actually bound, with the allocation it carries."""
        try:
            current = self._backend.get_pod(namespace=request.namespace, name=request.name)
        except Exception as exc:  # the feed will count it when it shows up bound
            current = None
            log.warning("pod %s: could not re-read it after a bind conflict: %s", request.key, exc)
        with self._lock:
            self._core.unreserve(request.uid)
            if current is None or pods.uid(current) != request.uid or not pods.holds_resources(current):
                log.warning("pod %s: bind conflict, and where it is bound is unknown; reservation released", request.key)
                return
            orphans = self._bound_pods.add(current, gpus=self._gpus, rules=self._rules())
            self._bound[request.uid] = NodeName(pods.node_name(current))
        self._report_orphans(orphans)

    def _signed(self, pod: Mapping[str, Any], uid: PodUID, node: NodeName, allocation: Allocation) -> SignedAllocation:
        if self._key is None:
            raise Unavailable("this scheduler has no signing key (read-only view); give --signing-key to bind")
        if not allocation.gpus:
            # A pod without GPUs carries no allocation: an empty one would read as a GPU pod on the node.
            return SignedAllocation(node=node, allocation=allocation, annotations={})
        try:
            allocation = with_containers(
                pod, allocation, rules=self._rules(), gpu_memory=lambda: self._gpu_memory(node), where=pods.key(pod)
            )
            annotations = allocation_annotations(self._key.signing_key(), pod_uid=uid, node_name=node, allocation=allocation)
        except (InvalidRequest, AllocationError) as exc:
            # Nothing is written, so nothing may stay reserved for the pod either.
            with self._lock:
                self._core.unreserve(uid)
            if isinstance(exc, AllocationError):
                raise InvalidRequest(f"pod {pods.key(pod)}: {exc}") from exc
            raise
        return SignedAllocation(node=node, allocation=allocation, annotations=annotations)

    def _gpu_memory(self, node: NodeName) -> dict[str, int]:
        with self._lock:
            views = self._core.node_views([node])
        return {g.device.uuid: g.device.memory_bytes for view in views for g in view.gpus}

    def _report_orphans(self, lines: Sequence[str]) -> None:
        # Each device update repeats the core's lines; report each orphan once.
        for line in lines:
            if line in self._reported:
                continue
            self._reported.add(line)
            log.error("allocation on a GPU that no longer exists: %s", line)
            self.metrics.orphaned_allocations.inc()
            self.orphans.append(line)
        self._report_unverified()

    def _report_unverified(self) -> None:
        with self._lock:
            news = self._bound_pods.take_news()
        for found in news:
            log.warning("%s", found.message())
            self.metrics.unverified_allocations_found.labels(counted=found.basis.value).inc()
            if self._recorder is not None and self._is_leader():  # one Event per pod, from the leader
                try:
                    self._recorder.unverified_allocation(found.involved_object(), found.message())
                except Exception as exc:  # an Event is a courtesy; never fail the feed for it
                    log.warning("could not post event for %s: %s", found.key, exc)

    def unverified(self) -> tuple[boundpods.Unverified, ...]:
        """Bound pods whose allocation does not verify, and what is counted for each (fgpuctl inspect)."""
        with self._lock:
            return self._bound_pods.unverified()

    def _require_loaded(self) -> None:
        if not self._loaded:
            raise Unavailable("scheduler state is still loading; retry in a moment")

    def _require_leader(self) -> None:
        self._require_loaded()
        if not self._is_leader():
            raise NotLeader("this fgpu-scheduler instance is a standby; the leader binds pods")

    def _event_failed(self, pod: Mapping[str, Any], message: str) -> None:
        self._event(pod, message, failed=True)

    def _event(self, pod: Mapping[str, Any], message: str, *, failed: bool) -> None:
        if self._recorder is None:
            return
        try:
            if failed:
                self._recorder.failed(pod, message)
            else:
                self._recorder.scheduled(pod, message)
        except Exception as exc:  # an Event is a courtesy; never fail scheduling for it
            log.warning("could not post event for %s: %s", pods.key(pod), exc)


def _verifier(keys: SchedulerKeys | None) -> boundpods.Verifier | None:
    """Checks with the keys as they are at each call (a rotation adds one without a restart)."""
    if keys is None:
        return None

    def verify(*, pod_uid: str, node_name: str, annotations: Mapping[str, str]) -> Allocation | None:
        return verify_pod_annotations(keys.verifying_keys(), pod_uid=pod_uid, node_name=node_name, annotations=annotations)

    return verify


def _report_places(devices: NodeDevices) -> list[str]:
    return [f"report.gpus[{i}]" for i in range(len(devices.gpus))]


def _describe(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if isinstance(errors, list) and errors:
        return "; ".join(str(e) for e in errors)
    return str(exc)
