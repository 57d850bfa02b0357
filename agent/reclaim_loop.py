"""Runs `agent.reclaim` against the node: reads usage and pods, evicts, tells the cluster.

Each `cycle()`:
1. the GPUs' memory and processes come from the usage sampler (`agent.usage`, NVML processes mapped
   to pods through cgroups), the GPUs' sizes from the node's devices. Only a sample not read before
   counts (`agent.reclaim_samples`: the NVML worker's latest sample is numbered, and reclaim usually
   reads more often than it samples); a read of the same sample decides nothing, and when no new
   sample came for `sample_max_age_s` every GPU's pressure ends (no data) until samples come again;
2. the pods on the node come from Kubernetes (`Kube.list_pods_on_node`); a pod's tier, request and
   limit are read from its *verified* allocation only (the signed `fgpu.io/burstable-limit`), its
   priority from `spec.priority`; a pod whose signature does not check out counts as guaranteed,
   so it can never be chosen;
3. `reclaim.decide` chooses; each choice is deleted with its termination grace (the pod's own, capped by
   the pool's `evictionGrace`, at least 1 s: `reclaim.termination_grace_s`) and a UID
   precondition (a pod recreated under the same name is never hit), as kubelet's node-pressure
   eviction does: not through the Eviction API, whose PodDisruptionBudgets could hold a burstable
   pod while guaranteed ones run out of memory, and which no admission policy can confine to the
   agent's own node (docs/overcommit.md). An Event on the pod (`BurstableEvicted`) and the metric
   `fgpu_agent_reclaim_evictions_total{gpu, result}` tell the cluster.

The pod listing is reused for `pods_refresh_s` (one list per node and cycle would load the API
server), except that it is listed again, at most once per cycle, when a GPU process belongs to a pod
uid the listing lacks (a pod that started since: its memory counts toward the pressure, so it must be
a candidate too; a uid still missing after a listing does not ask again until the next regular one),
and before any eviction is acted on (the decision is then made again on the new listing). The UID
precondition keeps a deletion from hitting a pod recreated under the same name. `dry_run` decides and reports without
evicting. Errors are logged and counted; the loop never raises, so a bad cycle cannot stop the
daemon. The policy may be swapped between cycles (`configure`, the settings file's hot reload).
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from agent.nodestate import UsageSample
from agent.reclaim import (
    Eviction,
    GPUMemory,
    PodOnGPU,
    ReclaimMemory,
    ReclaimPolicy,
    Verdict,
    decide,
    forget_pressure,
    termination_grace_s,
)
from agent.reclaim_samples import LastSample, judge
from agent.usage import GPUUsage
from apis import names
from apis.allocation import AllocationError
from apis.devices import NodeDevices
from apis.signing import SignatureError, VerifyingKeys, verify_pod_annotations

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class EvictionAPI(Protocol):
    def delete_pod(self, namespace: str, name: str, *, uid: str, grace_period_s: int | None = None) -> None: ...

    def create_event(self, namespace: str, body: JSON) -> JSON: ...

    def list_pods_on_node(self, node_name: str) -> list[JSON]: ...


def sample_max_age_s(poll_interval_s: float) -> float:
    """How long reclaim waits for the NVML worker's next sample before its data counts as lapsed.

    Three polls, and never under 5 s: a poll also rediscovers and checks health, and a busy node's
    NVML calls take their time; a lapse restarts every pressure grace, so it must not come from a
    poll that is merely slow.
    """
    return max(3 * poll_interval_s, 5.0)


class ReclaimLoop:
    def __init__(
        self,
        *,
        node_name: str,
        kube: EvictionAPI,
        keys: Callable[[], VerifyingKeys],
        devices: Callable[[], NodeDevices],
        usage: Callable[[], Sequence[GPUUsage]],
        policy: ReclaimPolicy,
        registry: CollectorRegistry,
        dry_run: bool = False,
        pods_refresh_s: float = 10.0,
        sample_max_age_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._node = node_name
        self._kube = kube
        self._keys = keys
        self._devices = devices
        self._usage = usage
        self._policy = policy
        self._dry_run = dry_run
        self._clock = clock
        self._now = now
        self._memory = ReclaimMemory()
        self._pods_refresh_s = pods_refresh_s
        self._pods: tuple[float, list[JSON]] | None = None
        #: the uids on the pod listing, and the process pod uids it lacked when it was made
        self._listed_uids: frozenset[str] = frozenset()
        self._unlisted: frozenset[str] = frozenset()
        #: cycles run, and the one in which the pods were last listed (one listing per cycle at most)
        self._cycles = 0
        self._listed_in = -1
        self._sample_max_age_s = sample_max_age_s
        self._last_sample = LastSample()
        self._lock = threading.Lock()
        self.evictions = Counter(
            names.METRIC_RECLAIM_EVICTIONS,
            "Burstable pods the agent evicted (or, in dry run, would have) to give GPU memory back; "
            "result: evicted, refused (the API said no: the pod was gone or replaced), dry_run.",
            ["gpu", "result"], registry=registry,
        )

    def configure(self, policy: ReclaimPolicy, *, dry_run: bool) -> None:
        with self._lock:
            self._policy = policy
            self._dry_run = dry_run

    def cycle(self) -> Verdict:
        """One pass; never raises (a failing read or eviction is logged)."""
        with self._lock:
            policy, dry_run = self._policy, self._dry_run
        self._cycles += 1
        now = self._clock()
        try:
            sample = self._usage()
        except Exception:
            log.exception("reclaim: cannot read the GPUs' usage; trying again next cycle")
            return Verdict(evictions=(), memory=self._memory)
        seq = sample.seq if isinstance(sample, UsageSample) else None
        reading = judge(self._last_sample, seq, now=now, max_age_s=self._sample_max_age_s)
        self._last_sample = reading.last
        if reading.lapsed and self._memory.pressure_since:
            log.warning("reclaim: no new GPU usage sample for over %gs: pressure timers restart", self._sample_max_age_s)
        if reading.lapsed:
            self._memory = forget_pressure(self._memory)
        if not reading.new:
            return Verdict(evictions=(), memory=self._memory)
        try:
            verdict = decide(self.observe(sample), policy, self._memory, now=now)
            if verdict.evictions and self._listed_in != self._cycles:
                # Decide again on a fresh listing: a pod that started since the last one may be the overuser.
                verdict = decide(self.observe(sample, relist=True), policy, self._memory, now=now)
        except Exception:
            log.exception("reclaim: cannot read the node's GPUs and pods; trying again next cycle")
            return Verdict(evictions=(), memory=self._memory)
        self._memory = verdict.memory
        for uuid in verdict.stuck:
            log.warning("reclaim: GPU %s is under memory pressure but holds no burstable pod to evict", uuid)
        for eviction in verdict.evictions:
            self._evict(eviction, policy, dry_run=dry_run)
        if verdict.evictions and not dry_run:
            self._pods = None  # the next cycle sees the evicted pods terminating
        return verdict

    def observe(self, sample: Sequence[GPUUsage] | None = None, *, relist: bool = False) -> list[GPUMemory]:
        """The node as the decision sees it in `sample` (None: read one now): each GPU's memory and its pods."""
        sample = self._usage() if sample is None else sample
        devices = self._devices()
        sizes = {g.uuid: g.memory_bytes for g in devices.gpus}
        owners = frozenset(p.pod_uid for u in sample if not u.error for p in u.processes if p.pod_uid)
        items = self._list_pods(owners, relist=relist)
        shares = pod_shares(items, keys=self._keys(), node_name=self._node, sizes=sizes)
        out = []
        for usage in sample:
            if usage.error or usage.uuid not in sizes:
                continue
            used_by: dict[str, int] = {}
            for process in usage.processes:
                if process.pod_uid:
                    used_by[process.pod_uid] = used_by.get(process.pod_uid, 0) + process.used_memory_bytes
            pods = tuple(replace(pod, used_bytes=used_by.get(pod.pod_uid, 0)) for pod in shares.get(usage.uuid, ()))
            out.append(GPUMemory(uuid=usage.uuid, total_bytes=sizes[usage.uuid], used_bytes=usage.memory_used_bytes,
                                 pods=pods))
        return out

    def _list_pods(self, owners: frozenset[str], *, relist: bool) -> list[JSON]:
        """The pods on the node, listed again when stale, when `relist`, or when a pod in `owners` is new.

        `owners` are the pod uids the GPUs' processes belong to. A listing made in this cycle is never
        repeated in it: a storm of unknown uids costs at most one listing per cycle.
        """
        now = self._clock()
        if self._pods is None or now - self._pods[0] >= self._pods_refresh_s or now < self._pods[0]:
            return self._fetch_pods(now, owners)
        if self._listed_in != self._cycles:
            unknown = owners - self._listed_uids - self._unlisted
            if relist or unknown:
                if unknown:
                    log.debug("reclaim: GPU processes of pods %s not on the pod list; listing again", sorted(unknown))
                return self._fetch_pods(now, owners)
        return self._pods[1]

    def _fetch_pods(self, now: float, owners: frozenset[str]) -> list[JSON]:
        items = self._kube.list_pods_on_node(self._node)
        self._pods = (now, items)
        self._listed_in = self._cycles
        self._listed_uids = frozenset(_uid(item) for item in items)
        # Processes of a pod the API does not list (static pods, a pod deleted while its processes
        # linger) would otherwise ask for a new listing every cycle.
        self._unlisted = owners - self._listed_uids
        return items

    def _evict(self, eviction: Eviction, policy: ReclaimPolicy, *, dry_run: bool) -> None:
        pod = eviction.pod
        overuse = max(0, pod.overuse) >> 20
        message = (f"evicted to give GPU memory back: {eviction.reason}; the pod used {pod.used_bytes >> 20} MiB, "
                   f"{overuse} MiB over its request (burstable, priority {pod.priority})")
        if dry_run:
            self.evictions.labels(gpu=eviction.gpu_uuid, result="dry_run").inc()
            log.info("reclaim (dry run): would evict %s/%s: %s", pod.namespace, pod.name, message)
            return
        try:
            self._kube.delete_pod(pod.namespace, pod.name, uid=pod.pod_uid,
                                  grace_period_s=termination_grace_s(policy, pod))
        except Exception as exc:
            self.evictions.labels(gpu=eviction.gpu_uuid, result="refused").inc()
            log.warning("reclaim: eviction of %s/%s refused: %s", pod.namespace, pod.name, exc)
            return
        self.evictions.labels(gpu=eviction.gpu_uuid, result="evicted").inc()
        log.warning("reclaim: evicted %s/%s: %s", pod.namespace, pod.name, message)
        try:
            self._kube.create_event(pod.namespace, event_body(pod, message, node=self._node, now=self._now()))
        except Exception as exc:
            log.warning("reclaim: no Event for %s/%s: %s", pod.namespace, pod.name, exc)


def pod_shares(
    items: Sequence[Mapping[str, Any]], *, keys: VerifyingKeys, node_name: str, sizes: Mapping[str, int]
) -> dict[str, list[PodOnGPU]]:
    """GPU uuid -> its pods' shares (limit_bytes 0: guaranteed), with no memory used yet."""
    out: dict[str, list[PodOnGPU]] = {}
    for item in items:
        meta = item.get("metadata") if isinstance(item.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        uid = str(meta.get("uid") or "")
        annotations = meta.get("annotations")
        if not uid or not isinstance(annotations, Mapping) or names.DEVICE_ALLOCATED not in annotations:
            continue
        phase = (item.get("status") or {}).get("phase") if isinstance(item.get("status"), Mapping) else None
        if phase in ("Succeeded", "Failed"):
            continue
        try:
            allocation = verify_pod_annotations(
                keys, pod_uid=uid, node_name=node_name, annotations={str(k): str(v) for k, v in annotations.items()}
            )
        except (SignatureError, AllocationError):
            allocation, trusted = None, False
        else:
            trusted = True
        spec = item.get("spec") if isinstance(item.get("spec"), Mapping) else {}
        assert isinstance(spec, Mapping)
        priority = _whole(spec.get("priority")) or 0
        grace = _whole(spec.get("terminationGracePeriodSeconds"))
        for share in allocation.gpus if allocation else ():
            if share.uuid not in sizes or share.mig_uuid or share.mig_profile:
                continue
            size = sizes[share.uuid]
            request = share.memory_bytes or size * share.memory_ratio_percent // 100
            limit = 0
            if trusted and share.limit is not None:
                limit = share.limit.memory_bytes or size * share.limit.memory_ratio_percent // 100
            out.setdefault(share.uuid, []).append(PodOnGPU(
                pod_uid=uid, namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name") or ""),
                burstable=limit > 0, priority=priority, request_bytes=request, limit_bytes=limit, used_bytes=0,
                termination_grace_s=grace,
            ))
    return out


def _uid(item: Mapping[str, Any]) -> str:
    meta = item.get("metadata")
    return str(meta.get("uid") or "") if isinstance(meta, Mapping) else ""


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def event_body(pod: PodOnGPU, message: str, *, node: str, now: datetime.datetime) -> JSON:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod.name}.fgpu-reclaim.", "namespace": pod.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace,
                           "uid": pod.pod_uid},
        "type": "Warning",
        "reason": names.EVENT_BURSTABLE_EVICTED,
        "message": message,
        "source": {"component": names.AGENT_NAME, "host": node},
        "reportingComponent": names.AGENT_NAME,
        "reportingInstance": node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
