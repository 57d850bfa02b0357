"""Whether a pod's owner exists and recreates it after an eviction (pure, table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler_plugin.descheduler.owners import Owners, why_not_recreated


def _pod(kind: str, *, uid: str = "owner-uid", restarts: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "ownerReferences": [
            {"apiVersion": "batch/v1" if kind == "Job" else "apps/v1", "kind": kind, "name": "o", "uid": uid, "controller": True}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "c", "restartCount": restarts}]},
    }


def _owner(spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "o", "namespace": "ns", "uid": "owner-uid", **meta}, "spec": spec or {}, "status": status or {}}


def _job(backoff: int | None = None, failed: int = 0, policy: str = "Never", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"template": {"spec": {"restartPolicy": policy}}, **spec}
    if backoff is not None:
        body["backoffLimit"] = backoff
    return _owner(body, {"failed": failed, "active": 1})


@pytest.mark.parametrize(
    ("kind", "owner", "pod_changes", "moves"),
    [
        ("ReplicaSet", _owner({"replicas": 2}), {}, True),
        ("ReplicaSet", None, {}, False),  # dangling reference
        ("ReplicaSet", _owner({"replicas": 2}), {"uid": "another"}, False),  # same name, another object
        ("ReplicaSet", _owner({"replicas": 2}, deletionTimestamp="2026-01-01T00:00:00Z"), {}, False),
        ("ReplicaSet", _owner({"replicas": 0}), {}, False),
        ("StatefulSet", _owner({"replicas": 3}), {}, True),
        ("Job", _job(), {}, True),  # backoffLimit defaults to 6
        ("Job", _job(backoff=0), {}, False),
        ("Job", _job(backoff=2, failed=1), {}, True),
        ("Job", _job(backoff=2, failed=2), {}, False),
        ("Job", _job(backoff=3, policy="OnFailure"), {"restarts": 3}, False),  # restarts count under OnFailure
        ("Job", _job(backoff=3, policy="Never"), {"restarts": 3}, True),
        ("Job", _job(suspend=True), {}, False),
        ("Job", _job(podFailurePolicy={"rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]}), {}, False),
        ("Job", _job(backoffLimitPerIndex=0, completionMode="Indexed"), {}, False),
        ("Job", _owner({}, {"conditions": [{"type": "Complete", "status": "True"}]}), {}, False),
    ],
)
def test_a_pod_moves_only_when_its_owner_exists_and_will_recreate_it(
    kind: str, owner: dict[str, Any] | None, pod_changes: dict[str, Any], moves: bool
) -> None:
    pod = _pod(kind, **pod_changes)
    listed = [owner] if owner else []
    owners = Owners.of(
        replica_sets=listed if kind == "ReplicaSet" else [],
        stateful_sets=listed if kind == "StatefulSet" else [],
        jobs=listed if kind == "Job" else [],
    )
    reason = why_not_recreated(pod, owners)
    assert (reason == "") is moves, reason


def test_an_owner_of_the_same_name_but_another_kind_is_not_the_owner() -> None:
    owners = Owners.of(replica_sets=[], stateful_sets=[_owner({"replicas": 1})], jobs=[])
    assert "does not exist" in why_not_recreated(_pod("ReplicaSet"), owners)
