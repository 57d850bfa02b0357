"""Review of the defragmenting descheduler (issue 18): defects found, each shown through the production path.

Each test was `xfail(strict=True)` while its defect stood; each now guards the fix.

The cluster (API double, as tests/defrag/test_controller_e2e.py builds it): three 1-GPU nodes; n1
holds two 20 % shares of ReplicaSet `web`, n2 two 30 % shares of ReplicaSet `db`, all in namespace
`prod`, which opted in with `fgpu.io/defrag=allow` (both ReplicaSets exist: the descheduler
looks owners up); n3 a bare 50 % pod. Another tenant's whole-GPU
pod `train` waits in namespace `tenant` (not opted in: it needs nothing to be moved for it).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.devices import to_device_object
from apis.signing import allocation_annotations
from scheduler_plugin.core.api import NodeName, PodUID
from scheduler_plugin.core.defrag_planner import Move
from scheduler_plugin.descheduler import cluster_view, safety
from scheduler_plugin.descheduler.controller import Controller, Settings, Stats
from scheduler_plugin.descheduler.evictor import Evictor, Limits
from scheduler_plugin.descheduler.kube import DeschedulerKube
from scheduler_plugin.descheduler.triggers import RoomSettings
from scheduler_plugin.errors import KubeAPIError
from tests.kubeapi import KubeAPIServer
from tests.scheduler_service import cluster as sched
from tests.scheduler_service.builders import gpu_node, share_pod, whole_pod
from tests.signing_keys import signing_key

KEY = signing_key("defrag-review-key")
VICTIMS = "prod"
TENANT = "tenant"
GIB = 1024**3
NOW = Settings(room=RoomSettings(pending_s=0, min_fragmentation=0.1))
VICTIM_NODES = {"web-1": "n1", "web-2": "n1", "db-1": "n2", "db-2": "n2"}


def _running_share(api: KubeAPIServer, name: str, node: str, app: str, percent: int, *, priority: int = 0) -> None:
    memory = 80 * percent // 100
    body = share_pod(name, core=percent, memory=f"{memory}Gi", namespace=VICTIMS, scheduler_name=names.SCHEDULER_NAME, node_name=node)
    if app:
        body["metadata"]["labels"] = {"app": app}
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": f"rs-{app}", "controller": True}
        ]
    if priority:
        body["spec"]["priority"] = priority
        body["spec"]["priorityClassName"] = "production"
    share = GPUShare(minor=0, uuid=f"GPU-{node}-00", core_percent=percent, memory_bytes=memory * GIB, memory_ratio_percent=0)
    body["metadata"]["annotations"] = allocation_annotations(
        KEY, pod_uid=body["metadata"]["uid"], node_name=node, allocation=Allocation(gpus=(share,))
    )
    body["status"] = {"phase": "Running"}
    sched.add_pod(api, body)


def _cluster(api: KubeAPIServer, *, victim_priority: int = 0) -> None:
    sched.install(api)
    api.put_object("/api/v1/namespaces", {"metadata": {"name": VICTIMS, "labels": {names.DEFRAG_OPT_IN_LABEL: names.DEFRAG_OPT_IN_VALUE}}})
    api.put_object("/api/v1/namespaces", {"metadata": {"name": TENANT}})
    for node in ("n1", "n2", "n3"):
        sched.add_node(api, gpu_node(node, gpus=1))
    for app in ("web", "db"):
        api.put_object(f"/apis/apps/v1/namespaces/{VICTIMS}/replicasets", {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": app, "namespace": VICTIMS, "uid": f"rs-{app}"}, "spec": {"replicas": 2},
        })
    for name, node in VICTIM_NODES.items():
        app, _, _ = name.partition("-")
        _running_share(api, name, node, app, 20 if app == "web" else 30, priority=victim_priority)
    _running_share(api, "bare", "n3", "", 50)


def _pending(api: KubeAPIServer, **changes: Any) -> dict[str, Any]:
    body = whole_pod("train", namespace=TENANT, scheduler_name=names.SCHEDULER_NAME)
    body["spec"].update(changes.pop("spec", {}))
    body.update(changes)
    return sched.add_pod(api, body)


def _victims_left(api: KubeAPIServer) -> set[str]:
    listed = api.get_object  # bypasses faults; reads what the store holds now
    return {name for name in VICTIM_NODES if listed(f"/api/v1/namespaces/{VICTIMS}/pods/{name}") is not None}


@pytest.fixture
def kube(kube_api: KubeAPIServer) -> Iterator[DeschedulerKube]:
    api_client = kubernetes.config.new_client_from_config(config_file=kube_api.kubeconfig_path)  # type: ignore[no-untyped-call]
    connected = DeschedulerKube(api_client)
    yield connected
    connected.close()


# --- 1. a pending pod the core cannot model gets other tenants' pods evicted -------------------------------


def test_a_pending_pod_blocked_by_a_missing_volume_gets_no_other_tenants_pod_evicted(
    kube_api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    _cluster(kube_api)
    _pending(
        kube_api,
        spec={"volumes": [{"name": "scratch", "persistentVolumeClaim": {"claimName": "does-not-exist"}}]},
        status={"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": '0/3 nodes are available: persistentvolumeclaim "does-not-exist" not found. '
                       "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.",
        }]},
    )
    controller = Controller(kube, Evictor(kube, Limits(dry_run=False)), NOW)

    controller.cycle(Stats())

    assert _victims_left(kube_api) == set(VICTIM_NODES), "pods of namespace prod were evicted for a pod that cannot bind"


# --- 2. deleting the pending pod dodges the settle check ---------------------------------------------------


def test_a_pending_pod_deleted_unbound_after_room_was_made_stops_the_evictor(
    kube_api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    _cluster(kube_api)
    _pending(kube_api)
    evictor = Evictor(kube, Limits(dry_run=False))
    controller = Controller(kube, evictor, NOW)
    first = controller.cycle(Stats())
    assert first.startswith(f"made room for {TENANT}/train"), first
    assert len(_victims_left(kube_api)) == 2

    kube_api.kubelet_confirm_deletion(TENANT, "train")  # deleted, never bound: the plan did not work out
    controller.cycle(Stats())

    assert evictor.stopped, "the room made was never used, yet the evictor goes on"


# --- 3. the rate limits are forgotten on restart -----------------------------------------------------------


def test_an_evictor_started_again_still_counts_the_moves_of_the_last_hour(
    kube_api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    _cluster(kube_api)
    _pending(kube_api)
    limits = Limits(per_hour=10, per_node_per_hour=2, dry_run=False)
    Controller(kube, Evictor(kube, limits), NOW).cycle(Stats())
    gone = set(VICTIM_NODES) - _victims_left(kube_api)
    (node,) = {VICTIM_NODES[name] for name in gone}
    assert len(gone) == 2

    restarted = Evictor(kube, limits)  # what main() builds when the process starts again

    assert restarted.node_moves_left(NodeName(node)) == 0
    assert restarted.moves_left() == 8


# --- 4. no priority guard ----------------------------------------------------------------------------------


def test_higher_priority_pods_are_not_evicted_for_a_lower_priority_pending_pod(
    kube_api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    _cluster(kube_api, victim_priority=1_000_000)
    _pending(kube_api, spec={"priority": 0})
    controller = Controller(kube, Evictor(kube, Limits(dry_run=False)), NOW)

    controller.cycle(Stats())

    assert _victims_left(kube_api) == set(VICTIM_NODES)


# --- 5. the owner is never looked up -----------------------------------------------------------------------


def _owned_pod(kind: str, api_version: str, *, uid: str = "owner-uid") -> dict[str, Any]:
    body = share_pod("worker-0", namespace=VICTIMS, scheduler_name=names.SCHEDULER_NAME, node_name="n1")
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": api_version, "kind": kind, "name": "owner", "uid": uid, "controller": True}
    ]
    body["status"] = {"phase": "Running"}
    return body


def test_an_owner_of_another_api_group_is_not_taken_for_a_recreating_controller() -> None:
    pod = _owned_pod("Job", "batch.volcano.sh/v1alpha1")

    reason = safety.why_not_movable(pod, {names.DEFRAG_OPT_IN_LABEL: names.DEFRAG_OPT_IN_VALUE})

    assert reason, "a Volcano Job's pod was taken for a batch/v1 Job's"


class _Listing:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items


class _Reader:
    """The cluster view's reads, plus the owners a fix has to look up (jobs, replica sets, stateful sets)."""

    def __init__(self, pods: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> None:
        node = gpu_node("n1", gpus=1)
        self._node = {"metadata": {"name": "n1", "uid": "node-n1", "labels": {}},
                      "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}
        self._device = to_device_object(node, node_uid="node-n1")
        self._pods = pods
        self._jobs = jobs

    def list_nodes(self) -> _Listing:
        return _Listing([self._node])

    def list_devices(self) -> _Listing:
        return _Listing([self._device])

    def list_pods(self) -> _Listing:
        return _Listing(self._pods)

    def list_pod_disruption_budgets(self) -> _Listing:
        return _Listing([])

    def list_namespaces(self) -> _Listing:
        return _Listing([{"metadata": {"name": VICTIMS, "labels": {names.DEFRAG_OPT_IN_LABEL: names.DEFRAG_OPT_IN_VALUE}}}])

    def list_jobs(self) -> _Listing:
        return _Listing(self._jobs)

    def list_replica_sets(self) -> _Listing:
        return _Listing([])

    def list_stateful_sets(self) -> _Listing:
        return _Listing([])


def test_a_job_that_allows_no_retry_and_a_missing_owner_make_no_candidate() -> None:
    no_retry = _owned_pod("Job", "batch/v1", uid="job-uid")
    dangling = _owned_pod("ReplicaSet", "apps/v1", uid="no-such-replicaset")
    dangling["metadata"]["name"] = "worker-1"
    dangling["metadata"]["uid"] = "pod-dangling"
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "owner", "namespace": VICTIMS, "uid": "job-uid"},
           "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never"}}}, "status": {"active": 1}}
    view = cluster_view.load(_Reader([no_retry, dangling], [job]), policy="fgpu", now=datetime.datetime.now(datetime.UTC))

    assert {c.request.key for c in view.candidates.values()} == set()


# --- 6. smaller: outcomes the evictor does not treat as unexpected -----------------------------------------


class _Cluster:
    def __init__(self, *, event_fails: bool = False) -> None:
        self.evicted: list[str] = []
        self.events: list[tuple[str, str]] = []
        self.stop = ""
        self._event_fails = event_fails

    def evict_pod(self, *, namespace: str, name: str, uid: str) -> None:
        self.evicted.append(f"{namespace}/{name}")

    def record_event(self, *, namespace: str, name: str, uid: str, reason: str, message: str, node: str) -> None:
        if self._event_fails:
            raise KubeAPIError("Kubernetes API: 500 InternalError etcdserver: request timed out", status=500)
        self.events.append((f"{namespace}/{name}", reason))

    def recent_moves(self, *, reason: str, since: datetime.datetime) -> list[tuple[datetime.datetime, str]]:
        return []  # a fresh cluster: no earlier moves on record

    def saved_stop(self) -> str:
        return self.stop

    def save_stop(self, reason: str) -> None:
        self.stop = reason


def _moves(node: str, *names_: str) -> list[Move]:
    return [Move(uid=PodUID(n), key=f"{VICTIMS}/{n}", from_node=NodeName(node), to_node=NodeName("n3")) for n in names_]


def test_an_eviction_whose_event_fails_stops_the_evictor() -> None:
    cluster = _Cluster(event_fails=True)
    evictor = Evictor(cluster, Limits(dry_run=False))

    with contextlib.suppress(KubeAPIError):  # main.py's loop catches it the same way
        evictor.act(_moves("n2", "db-1", "db-2"), uids={}, purpose="make room for pending pod tenant/train")

    assert cluster.evicted == [f"{VICTIMS}/db-1"]
    assert evictor.stopped


def test_dry_run_applies_the_limits_the_real_mode_would() -> None:
    cluster = _Cluster()
    evictor = Evictor(cluster, Limits(per_hour=10, per_node_per_hour=2, dry_run=True))
    first = evictor.act(_moves("n2", "db-1", "db-2"), uids={}, purpose="p")
    assert first.aborted == "" and cluster.evicted == []

    second = evictor.act(_moves("n2", "db-3", "db-4"), uids={}, purpose="p")

    assert second.aborted == "rate-limit", "dry-run says it would move 4 pods off n2 within the hour; the limit is 2"


def _leaving(api: KubeAPIServer) -> set[str]:
    """Victims that are being deleted (evicted, still shutting down on their node) or gone."""
    found = set()
    for name in VICTIM_NODES:
        pod = api.get_object(f"/api/v1/namespaces/{VICTIMS}/pods/{name}")
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            found.add(name)
    return found
