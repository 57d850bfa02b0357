"""End to end on the API double: a fragmented cluster, a pending whole-GPU pod, the descheduler moves pods
through the Eviction API, and the running fgpu scheduler (standalone mode) binds what follows.

Three 1-GPU nodes. n1 holds two 20 % shares of ReplicaSet `web`, under a PodDisruptionBudget that
allows one disruption; n2 two 30 % shares of ReplicaSet `db`; n3 a bare 50 % pod. The namespace
opts in. A whole-GPU pod `train` is pending: 150 % of a GPU is idle, in three pieces. Emptying n1
would need two `web` evictions, which the budget forbids, so the controller must empty n2 instead,
evicting both `db` pods through the Eviction API, each with an Event naming `train`. The scheduler
then binds `train` on n2; the test recreates the `db` pods as their ReplicaSet would, and the
scheduler places them on n1 and n3. Every binding is the scheduler's, with signed allocations.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes import client

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.signing import allocation_annotations, verify_pod_annotations
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.defrag_planner import Move
from scheduler_plugin.descheduler.controller import Controller, Settings, Stats, run_cycle
from scheduler_plugin.descheduler.evictor import Evictor, Limits
from scheduler_plugin.descheduler.kube import DeschedulerKube
from scheduler_plugin.descheduler.triggers import ConsolidationSettings, RoomSettings
from tests.kubeapi import KubeAPIServer
from tests.scheduler_service import cluster as sched
from tests.scheduler_service.builders import gpu_node, share_pod, whole_pod
from tests.signing_keys import signing_key, write_signing_key

KEY = signing_key("defrag-e2e-key")
NS = "batch"
PDB_PATH = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"
GIB = 1024**3
#: act at once, for any fragmentation: the thresholds have their own tests (test_triggers.py)
NOW = Settings(room=RoomSettings(pending_s=0, min_fragmentation=0.1))


def _owned(body: dict[str, Any], app: str) -> dict[str, Any]:
    body["metadata"]["labels"] = {"app": app}
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": f"rs-{app}", "controller": True}
    ]
    return body


def _running_share(api: KubeAPIServer, name: str, node: str, app: str, percent: int) -> None:
    """A pod fgpu placed earlier: bound, running, its allocation signed with the scheduler's key."""
    memory = 80 * percent // 100
    body = share_pod(name, core=percent, memory=f"{memory}Gi", namespace=NS, scheduler_name=names.SCHEDULER_NAME, node_name=node)
    if app:
        _owned(body, app)
    share = GPUShare(minor=0, uuid=f"GPU-{node}-00", core_percent=percent, memory_bytes=memory * GIB, memory_ratio_percent=0)
    body["metadata"]["annotations"] = allocation_annotations(
        KEY, pod_uid=body["metadata"]["uid"], node_name=node, allocation=Allocation(gpus=(share,))
    )
    body["status"] = {"phase": "Running"}
    sched.add_pod(api, body)


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    return write_signing_key(str(tmp_path / "signing-key"), KEY)


@pytest.fixture
def fragmented(kube_api: KubeAPIServer) -> Iterator[tuple[KubeAPIServer, DeschedulerKube]]:
    sched.install(kube_api)
    kube_api.put_object("/api/v1/namespaces", {"metadata": {"name": NS, "labels": {names.DEFRAG_OPT_IN_LABEL: names.DEFRAG_OPT_IN_VALUE}}})
    for node in ("n1", "n2", "n3"):
        sched.add_node(kube_api, gpu_node(node, gpus=1))
    for app in ("web", "db"):  # the owners exist: the descheduler looks them up
        kube_api.put_object(f"/apis/apps/v1/namespaces/{NS}/replicasets", {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": app, "namespace": NS, "uid": f"rs-{app}"}, "spec": {"replicas": 2},
        })
    for node, app, percent in (("n1", "web", 20), ("n2", "db", 30)):
        for i in (1, 2):
            _running_share(kube_api, f"{app}-{i}", node, app, percent)
    _running_share(kube_api, "bare", "n3", "", 50)
    kube_api.put_object(PDB_PATH, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": NS, "generation": 1},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 1, "observedGeneration": 1, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2},
    })
    sched.add_pod(kube_api, whole_pod("train", namespace=NS, scheduler_name=names.SCHEDULER_NAME))
    kube = DeschedulerKube(kubernetes.config.new_client_from_config(config_file=kube_api.kubeconfig_path))
    yield kube_api, kube
    kube.close()


@pytest.fixture
def scheduler(fragmented: tuple[KubeAPIServer, DeschedulerKube], key_file: str) -> Iterator[SchedulerApp]:
    app = sched.start(sched.config(fragmented[0], key_file, standalone=True))
    yield app
    app.stop(1.0)


def _pods(api: KubeAPIServer) -> dict[str, dict[str, Any]]:
    """The namespace's pods as the API lists them (a kubectl get)."""
    reader = kubernetes.config.new_client_from_config(config_file=api.kubeconfig_path)
    try:
        items = reader.sanitize_for_serialization(client.CoreV1Api(reader).list_namespaced_pod(NS).items)
    finally:
        reader.close()
    return {p["metadata"]["name"]: p for p in items}


def _node_of(api: KubeAPIServer, name: str) -> str:
    found = _pods(api).get(name)
    return str((found or {}).get("spec", {}).get("nodeName") or "")


def _events(api: KubeAPIServer) -> list[Any]:
    reader = kubernetes.config.new_client_from_config(config_file=api.kubeconfig_path)
    try:
        return list(client.CoreV1Api(reader).list_namespaced_event(NS).items)
    finally:
        reader.close()


def test_the_controller_moves_what_the_budget_allows_and_the_scheduler_binds_the_pending_and_recreated_pods(
    fragmented: tuple[KubeAPIServer, DeschedulerKube], scheduler: SchedulerApp
) -> None:
    api, kube = fragmented
    sched.eventually(scheduler.is_leader, what="the scheduler leads")
    assert _node_of(api, "train") == ""
    evictor = Evictor(kube, Limits(per_hour=10, per_node_per_hour=2, dry_run=False))
    controller = Controller(kube, evictor, NOW)
    stats = Stats()

    line = controller.cycle(stats)

    head, _, moved = line.partition(": moved ")
    assert head == "made room for batch/train on n2"
    assert sorted(moved.split(", ")) == ["batch/db-1", "batch/db-2"]
    assert (stats.moves, stats.made_room) == (2, 1)
    assert not {"db-1", "db-2"} & set(_pods(api))
    assert {"web-1", "web-2", "bare"} <= set(_pods(api))  # the budget kept n1 whole; the bare pod never moves
    evicted = {e.involved_object.name: e.message for e in _events(api) if e.reason == names.EVENT_DEFRAG_EVICTED}
    assert sorted(evicted) == ["db-1", "db-2"]
    assert all("make room for pending pod batch/train" in m for m in evicted.values())
    budget = api.get_object(f"{PDB_PATH}/web") or {}
    assert budget["status"]["disruptionsAllowed"] == 1  # no web pod was evicted

    # The running scheduler binds the pending pod where the plan made room.
    sched.eventually(lambda: _node_of(api, "train") == "n2", what="train bound on n2")
    # The ReplicaSet recreates its pods (new names, after the evictions); the scheduler places them.
    for i in (1, 2):
        sched.add_pod(api, _owned(share_pod(f"db-{i}-new", core=30, memory="24Gi", namespace=NS, scheduler_name=names.SCHEDULER_NAME), "db"))
    sched.eventually(lambda: all(_node_of(api, f"db-{i}-new") for i in (1, 2)), what="the recreated pods bound")
    landed = {_node_of(api, f"db-{i}-new") for i in (1, 2)}
    assert landed <= {"n1", "n3"}, landed
    for name in ("train", "db-1-new", "db-2-new"):
        bound = _pods(api)[name]
        allocation = verify_pod_annotations(
            KEY.verifying_keys(), pod_uid=bound["metadata"]["uid"], node_name=bound["spec"]["nodeName"],
            annotations=bound["metadata"]["annotations"],
        )
        assert allocation is not None, name
    # Nothing is pending any more: the next cycle does nothing, and the plan counts as settled.
    assert controller.cycle(Stats()).startswith("no GPU pod pending")
    assert not evictor.stopped


def test_an_eviction_the_budget_no_longer_allows_is_refused_by_the_api_and_stops_the_plan(
    fragmented: tuple[KubeAPIServer, DeschedulerKube],
) -> None:
    api, kube = fragmented
    evictor = Evictor(kube, Limits(dry_run=False))
    moves = [Move(uid=_pods(api)[n]["metadata"]["uid"], key=f"{NS}/{n}", from_node=NodeName("n1"), to_node=NodeName("n3"))
             for n in ("web-1", "web-2")]
    outcome = evictor.act(moves, uids={}, purpose=f"make room for pending pod {NS}/train")
    assert outcome == type(outcome)(evicted=(f"{NS}/web-1",), aborted="disruption-budget")
    assert "web-2" in _pods(api)
    assert not evictor.stopped  # a budget's refusal is expected; only unexpected answers stop the evictor


def test_dry_run_evicts_nothing_and_records_what_it_would_do(fragmented: tuple[KubeAPIServer, DeschedulerKube]) -> None:
    api, kube = fragmented
    before = set(_pods(api))
    line = run_cycle(kube, Evictor(kube, Limits(dry_run=True)), NOW, Stats())
    assert line.startswith("made room for batch/train on n2")
    assert set(_pods(api)) == before
    would = sorted(e.involved_object.name for e in _events(api) if e.reason == names.EVENT_DEFRAG_WOULD_EVICT)
    assert would == ["db-1", "db-2"]


def test_a_pod_pending_shorter_than_the_threshold_triggers_nothing(fragmented: tuple[KubeAPIServer, DeschedulerKube]) -> None:
    api, kube = fragmented
    later = datetime.datetime.now(datetime.UTC)
    settings = Settings(room=RoomSettings(pending_s=3600, min_fragmentation=0.1))
    line = run_cycle(kube, Evictor(kube, Limits(dry_run=False)), settings, Stats(), now=lambda: later)
    assert line.startswith("no GPU pod pending 3600s")
    assert len(_pods(api)) == 6


def test_a_pod_still_pending_after_its_room_was_made_stops_the_evictor(
    fragmented: tuple[KubeAPIServer, DeschedulerKube],
) -> None:
    # No scheduler runs here: the room made on n2 is never used, which the plan did not foresee.
    api, kube = fragmented
    clock = [0.0]
    evictor = Evictor(kube, Limits(dry_run=False), clock=lambda: clock[0])
    controller = Controller(kube, evictor, Settings(room=NOW.room, settle_s=60), monotonic=lambda: clock[0])
    assert controller.cycle(Stats()).startswith("made room for batch/train")
    clock[0] = 61.0
    stats = Stats()
    assert controller.cycle(stats).startswith("stopped: pod batch/train is still pending")
    assert stats.aborted == {"pending-pod-did-not-bind": 1}
    assert {"web-1", "web-2"} <= set(_pods(api))



def test_the_consolidation_mode_empties_a_light_node_the_budget_lets_it_and_only_once_per_period(
    fragmented: tuple[KubeAPIServer, DeschedulerKube],
) -> None:
    # n1 (40 %) is lightest but its budget allows one of its two pods to go; n2 (60 %) can be
    # emptied; n3's bare pod pins it. No pending pod is old enough to make room for.
    api, kube = fragmented
    clock = [0.0]
    settings = Settings(
        room=RoomSettings(pending_s=3600),
        consolidation=ConsolidationSettings(every_s=600, max_occupancy=0.7),
    )
    controller = Controller(kube, Evictor(kube, Limits(dry_run=False), clock=lambda: clock[0]), settings,
                            monotonic=lambda: clock[0])
    stats = Stats()
    line = controller.cycle(stats)
    assert line.startswith("no GPU pod pending 3600s")
    assert "emptied n2: moved" in line
    assert stats.consolidated_nodes == 1 and stats.aborted == {"over-move-or-disruption-budget": 1}
    assert not {"db-1", "db-2"} & set(_pods(api))
    messages = {e.involved_object.name: e.message for e in _events(api) if e.reason == names.EVENT_DEFRAG_EVICTED}
    assert sorted(messages) == ["db-1", "db-2"] and all("empty node n2" in m for m in messages.values())
    clock[0] = 599.0
    assert "emptied" not in controller.cycle(Stats())  # not due again yet
