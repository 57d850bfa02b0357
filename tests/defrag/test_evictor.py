"""The evictor's answers to the API, and what it keeps across a restart (on the API double where it talks to one)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes import client

from apis import names
from scheduler_plugin.core.api import NodeName, PodUID
from scheduler_plugin.core.defrag_planner import Move
from scheduler_plugin.descheduler.evictor import Evictor, Limits
from scheduler_plugin.descheduler.kube import DeschedulerKube, moves_of
from scheduler_plugin.errors import KubeAPIError
from tests.kubeapi import KubeAPIServer

NOW = datetime.datetime(2026, 5, 1, 12, 0, tzinfo=datetime.UTC)


class _Refusing:
    """A cluster whose Eviction API answers `error` every time."""

    def __init__(self, error: KubeAPIError) -> None:
        self.error = error
        self.stop = ""

    def evict_pod(self, *, namespace: str, name: str, uid: str) -> None:
        raise self.error

    def record_event(self, *, namespace: str, name: str, uid: str, reason: str, message: str, node: str) -> None:
        raise AssertionError("no Event for a pod that was not evicted")

    def recent_moves(self, *, reason: str, since: datetime.datetime) -> list[tuple[datetime.datetime, str]]:
        return []

    def saved_stop(self) -> str:
        return self.stop

    def save_stop(self, reason: str) -> None:
        self.stop = reason


def _move(name: str, node: str = "n1", uid: str = "") -> Move:
    return Move(uid=PodUID(uid or f"uid-{name}"), key=f"ns/{name}", from_node=NodeName(node), to_node=NodeName("n3"))


@pytest.mark.parametrize(
    ("error", "aborted", "stops"),
    [
        (KubeAPIError("Kubernetes API: 429 TooManyRequests Cannot evict pod as it would violate the pod's disruption budget.",
                      status=429, reason="TooManyRequests"), "disruption-budget", False),
        (KubeAPIError("Kubernetes API: 429 TooManyRequests Too many requests, please try again later.",
                      status=429, reason="TooManyRequests"), "api-throttled", False),
        (KubeAPIError("Kubernetes API: 404 NotFound pods \"a\" not found", status=404), "pod-gone", False),
        (KubeAPIError("Kubernetes API: 409 Conflict Operation cannot be fulfilled on Pod \"a\": Precondition failed: "
                      "UID in precondition: x, UID in object meta: y", status=409), "pod-gone", False),
        (KubeAPIError("Kubernetes API: 409 Conflict the object has been modified", status=409), "unexpected-answer", True),
        (KubeAPIError("Kubernetes API: 403 Forbidden", status=403), "unexpected-answer", True),
    ],
    ids=["budget", "throttled", "gone", "replaced", "conflict", "forbidden"],
)
def test_each_refusal_of_the_eviction_api_stops_the_plan_and_only_unexpected_ones_the_evictor(
    error: KubeAPIError, aborted: str, stops: bool
) -> None:
    cluster = _Refusing(error)
    evictor = Evictor(cluster, Limits(dry_run=False))
    outcome = evictor.act([_move("a")], uids={}, purpose="p")
    assert (outcome.evicted, outcome.aborted) == ((), aborted)
    assert bool(evictor.stopped) is stops
    assert bool(cluster.stop) is stops  # a stop is recorded for the next start
    assert evictor.moves_left() == 10  # nothing was moved


def _event(reason: str, when: datetime.datetime, node: str, component: str = names.DESCHEDULER_NAME) -> dict[str, Any]:
    return {"reason": reason, "source": {"component": component}, "lastTimestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "related": {"kind": "Node", "name": node}}


def test_the_last_hours_moves_are_read_from_the_descheduler_own_events_of_the_mode() -> None:
    hour_ago = NOW - datetime.timedelta(hours=1)
    events = [
        _event(names.EVENT_DEFRAG_EVICTED, NOW - datetime.timedelta(minutes=5), "n1"),
        _event(names.EVENT_DEFRAG_EVICTED, NOW - datetime.timedelta(minutes=61), "n1"),  # older than the hour
        _event(names.EVENT_DEFRAG_WOULD_EVICT, NOW, "n2"),  # dry-run's, not real moves
        _event(names.EVENT_DEFRAG_EVICTED, NOW, "n3", component="kubelet"),
    ]
    assert moves_of(events, reason=names.EVENT_DEFRAG_EVICTED, since=hour_ago) == [(NOW - datetime.timedelta(minutes=5), "n1")]


@pytest.fixture
def kube(kube_api: KubeAPIServer) -> Iterator[DeschedulerKube]:
    connected = DeschedulerKube(kubernetes.config.new_client_from_config(config_file=kube_api.kubeconfig_path))  # type: ignore[no-untyped-call]
    connected.state_namespace = "fgpu-system"
    yield connected
    connected.close()


def _running(api: KubeAPIServer, name: str) -> dict[str, Any]:
    return api.put_object("/api/v1/namespaces/ns/pods", {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"},
    })


def test_a_pod_recreated_under_the_same_name_is_not_evicted_in_place_of_the_planned_one(
    kube_api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    planned = _running(kube_api, "db-0")
    kube_api.kubelet_confirm_deletion("ns", "db-0")  # its StatefulSet recreates db-0 before the plan runs
    recreated = _running(kube_api, "db-0")
    evictor = Evictor(kube, Limits(dry_run=False))

    outcome = evictor.act([_move("db-0", uid=planned["metadata"]["uid"])], uids={}, purpose="p")

    assert outcome.aborted == "pod-gone" and not evictor.stopped
    left = kube_api.get_object("/api/v1/namespaces/ns/pods/db-0") or {}
    assert left["metadata"]["uid"] == recreated["metadata"]["uid"] != planned["metadata"]["uid"]


def test_a_stop_holds_across_a_restart_until_its_configmap_is_deleted(kube_api: KubeAPIServer, kube: DeschedulerKube) -> None:
    Evictor(kube, Limits(dry_run=False)).stop("pod ns/train is still pending 600s after room was made for it")

    restarted = Evictor(kube, Limits(dry_run=False))

    assert "ns/train is still pending" in restarted.stopped
    assert restarted.act([_move("a")], uids={}, purpose="p").aborted.startswith("stopped:")
    operator = kubernetes.config.new_client_from_config(config_file=kube_api.kubeconfig_path)  # type: ignore[no-untyped-call]
    try:  # what the operator does to resume: kubectl delete configmap
        client.CoreV1Api(operator).delete_namespaced_config_map(names.DESCHEDULER_STOP_CONFIGMAP, "fgpu-system")
    finally:
        operator.close()
    assert not Evictor(kube, Limits(dry_run=False)).stopped


def test_dry_run_moves_count_against_a_restarted_dry_run_and_not_against_the_real_mode(
    kube_api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    for name in ("a", "b"):
        _running(kube_api, name)
    limits = Limits(per_hour=10, per_node_per_hour=2, dry_run=True)
    assert Evictor(kube, limits).act([_move("a"), _move("b")], uids={}, purpose="p").aborted == ""

    assert Evictor(kube, limits).node_moves_left(NodeName("n1")) == 0
    assert Evictor(kube, Limits(per_hour=10, per_node_per_hour=2, dry_run=False)).node_moves_left(NodeName("n1")) == 2
    assert {"a", "b"} <= {p["metadata"]["name"] for p in kube.list_pods().items}
