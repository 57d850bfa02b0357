"""Does a pod's controller owner exist, and will it recreate the pod once it is evicted? (pure)

An ownerReference is only a claim written on the pod; the owner itself is looked up (listed each
cycle: ReplicaSets, StatefulSets, Jobs). A pod may move only when its controller reference names
an owner that exists in the pod's namespace with the same uid (a deleted and recreated owner of
the same name has another uid, and no longer adopts the pod), is not being deleted, and:

* a ReplicaSet or StatefulSet still wants a replica (`spec.replicas` >= 1);
* a Job is neither suspended nor finished, and allows one more failure: an evicted Job pod counts
  as failed, and the Job fails once failures exceed `backoffLimit` (default 6). Failures so far
  are `status.failed`, plus, under `restartPolicy: OnFailure` (where container restarts count
  against the limit), the pod's own container restarts. A `podFailurePolicy` with a `FailJob`
  rule could fail the Job on the eviction itself, and a `backoffLimitPerIndex` of 0 fails the
  index: neither moves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_plugin.descheduler.safety import controller_ref

#: batch/v1 defaulting of Job.spec.backoffLimit
DEFAULT_BACKOFF_LIMIT = 6


@dataclass(frozen=True)
class Owners:
    """Controllers by (kind, namespace, name), as listed this cycle."""

    objects: Mapping[tuple[str, str, str], Mapping[str, Any]] = field(default_factory=dict)

    @staticmethod
    def of(
        *, replica_sets: Iterable[Mapping[str, Any]], stateful_sets: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]]
    ) -> Owners:
        objects: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        # List items carry no kind: which list an object came from says it.
        for kind, items in (("ReplicaSet", replica_sets), ("StatefulSet", stateful_sets), ("Job", jobs)):
            for obj in items:
                meta = obj.get("metadata") or {}
                objects[kind, str(meta.get("namespace") or ""), str(meta.get("name") or "")] = obj
        return Owners(objects)

    def find(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objects.get((kind, namespace, name))


def why_not_recreated(pod: Mapping[str, Any], owners: Owners) -> str:
    """"" when the pod's controller owner exists and will recreate it after an eviction, else why not."""
    ref = controller_ref(pod)
    if ref is None:
        return "no controller owner"
    kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    owner = owners.find(kind, namespace, name)
    what = f"owner {kind} {namespace}/{name}"
    if owner is None:
        return f"{what} does not exist"
    meta = owner.get("metadata") or {}
    if str(meta.get("uid") or "") != str(ref.get("uid") or ""):
        return f"{what} has uid {meta.get('uid')}, the pod names {ref.get('uid')}: it is not the pod's owner"
    if meta.get("deletionTimestamp"):
        return f"{what} is being deleted"
    spec = owner.get("spec") or {}
    if kind in ("ReplicaSet", "StatefulSet"):
        replicas = spec.get("replicas")
        if replicas is not None and _int(replicas) < 1:
            return f"{what} is scaled to 0 replicas"
        return ""
    return _why_job_would_not_retry(what, owner, pod)


def _why_job_would_not_retry(what: str, job: Mapping[str, Any], pod: Mapping[str, Any]) -> str:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    if spec.get("suspend"):
        return f"{what} is suspended"
    for condition in status.get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet") and condition.get("status") == "True":
            return f"{what} is finished ({condition.get('type')})"
    if any((rule or {}).get("action") == "FailJob" for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []):
        return f"{what} has a podFailurePolicy FailJob rule an eviction could meet"
    per_index = spec.get("backoffLimitPerIndex")
    if per_index is not None and _int(per_index) < 1:
        return f"{what} has backoffLimitPerIndex {per_index}: an evicted pod fails its index"
    limit = spec.get("backoffLimit")
    backoff = DEFAULT_BACKOFF_LIMIT if limit is None else _int(limit)
    failures = _int(status.get("failed") or 0)
    restart_policy = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy") or "Never"
    if restart_policy == "OnFailure":
        failures += sum(_int((c or {}).get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])
    if per_index is None and backoff <= failures:
        return (
            f"{what} allows no more retries (backoffLimit {backoff}, {failures} failure(s) so far, "
            f"restartPolicy {restart_policy}): evicting its pod would fail the Job"
        )
    return ""


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
