"""Runs `agent.reclaim` against the node: reads usage and pods, evicts, tells the cluster.

Each `cycle()`:
1. the GPUs' memory and processes come from the usage sampler (`agent.usage`, NVML processes mapped
   to pods through cgroups), the GPUs' sizes from the node's devices;
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
server); the UID precondition makes a stale listing safe. `dry_run` decides and reports without
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

from agent.reclaim import (
    Eviction,
    GPUMemory,
    PodOnGPU,
    ReclaimMemory,
    ReclaimPolicy,
    Verdict,
    decide,
    termination_grace_s,
)
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
        try:
            gpus = self.observe()
        except Exception:
            log.exception("reclaim: cannot read the node's GPUs and pods; trying again next cycle")
            return Verdict(evictions=(), memory=self._memory)
        verdict = decide(gpus, policy, self._memory, now=self._clock())
        self._memory = verdict.memory
        for uuid in verdict.stuck:
            log.warning("reclaim: GPU %s is under memory pressure but holds no burstable pod to evict", uuid)
        for eviction in verdict.evictions:
            self._evict(eviction, policy, dry_run=dry_run)
        if verdict.evictions and not dry_run:
            self._pods = None  # the next cycle sees the evicted pods terminating
        return verdict

    def observe(self) -> list[GPUMemory]:
        """The node as the decision sees it: each GPU's memory and the pods on it."""
        devices = self._devices()
        sizes = {g.uuid: g.memory_bytes for g in devices.gpus}
        shares = pod_shares(self._list_pods(), keys=self._keys(), node_name=self._node, sizes=sizes)
        out = []
        for usage in self._usage():
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

    def _list_pods(self) -> list[JSON]:
        now = self._clock()
        if self._pods is None or now - self._pods[0] >= self._pods_refresh_s or now < self._pods[0]:
            self._pods = (now, self._kube.list_pods_on_node(self._node))
        return self._pods[1]

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
