"""Standalone mode against the API double: pending pods bound by us, Events, leader failover."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from apis import names
from apis.allocation import decode_allocation
from apis.devices import to_device_object
from apis.signing import verify_pod_annotations
from scheduler_plugin.app import SchedulerApp
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, share_pod, whole_pod
from tests.scheduler_service.conftest import KEY

LEASE_S = 2.0


@pytest.fixture
def apps() -> Iterator[list[SchedulerApp]]:
    started: list[SchedulerApp] = []
    yield started
    for app in started:
        app.stop(1.0)


def core_api(api: KubeAPIServer) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=api.kubeconfig_path))  # type: ignore[no-untyped-call]


def pods_in(api: KubeAPIServer) -> list[dict[str, Any]]:
    core = core_api(api)
    return list(core.api_client.sanitize_for_serialization(core.list_namespaced_pod("default").items))


def events_of(api: KubeAPIServer, pod_name: str) -> list[dict[str, Any]]:
    core = core_api(api)
    items = core.api_client.sanitize_for_serialization(core.list_namespaced_event("default").items)
    return [e for e in items if e["involvedObject"]["name"] == pod_name]


def gpu_use(api: KubeAPIServer) -> dict[tuple[str, str], int]:
    """(node, GPU uuid) -> core percent, from the annotations of every bound pod in the API."""
    use: dict[tuple[str, str], int] = defaultdict(int)
    for pod in pods_in(api):
        node = pod["spec"].get("nodeName")
        text = (pod["metadata"].get("annotations") or {}).get(names.DEVICE_ALLOCATED)
        if node and text:
            for share in decode_allocation(text).gpus:
                use[node, share.uuid] += share.core_percent
    return dict(use)


def test_pending_pods_for_fgpu_scheduler_are_bound_with_signed_allocations(
    kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=2))
    apps.append(cluster.start(cluster.config(kube_api, key_file, standalone=True, lease_s=LEASE_S)))
    for i in range(3):
        cluster.add_pod(kube_api, share_pod(f"p{i}", core=60, memory="20Gi", scheduler_name=names.SCHEDULER_NAME))
    cluster.add_pod(kube_api, share_pod("not-ours", core=60, memory="20Gi", scheduler_name="default-scheduler"))

    cluster.eventually(lambda: sum(1 for p in pods_in(kube_api) if p["spec"].get("nodeName")) == 2, what="two binds")
    time.sleep(0.5)

    bound = {p["metadata"]["name"]: p for p in pods_in(kube_api) if p["spec"].get("nodeName")}
    assert len(bound) == 2 and "not-ours" not in bound
    for pod in bound.values():
        assert verify_pod_annotations(KEY.verifying_keys(), pod_uid=pod["metadata"]["uid"], node_name="n1", annotations=pod["metadata"]["annotations"])
    assert sorted(gpu_use(kube_api).values()) == [60, 60]
    waiting = next(p for p in pods_in(kube_api) if p["metadata"]["name"].startswith("p") and not p["spec"].get("nodeName"))
    cluster.eventually(lambda: any(e["reason"] == "FailedScheduling" for e in events_of(kube_api, waiting["metadata"]["name"])), what="event")
    message = next(e for e in events_of(kube_api, waiting["metadata"]["name"]) if e["reason"] == "FailedScheduling")["message"]
    assert message.startswith("0/1 nodes are available: 1 node(s):")
    assert any(e["reason"] == "Scheduled" for name in bound for e in events_of(kube_api, name))


def test_a_waiting_pod_is_bound_once_a_gpu_is_freed(kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    apps.append(cluster.start(cluster.config(kube_api, key_file, standalone=True, lease_s=LEASE_S)))
    cluster.add_pod(kube_api, whole_pod("first", scheduler_name=names.SCHEDULER_NAME))
    cluster.eventually(lambda: cluster.get_pod(kube_api, "first")["spec"].get("nodeName") == "n1", what="first bound")
    cluster.add_pod(kube_api, whole_pod("second", scheduler_name=names.SCHEDULER_NAME))
    cluster.eventually(lambda: bool(events_of(kube_api, "second")), what="second unschedulable")

    core = core_api(kube_api)
    core.delete_namespaced_pod("first", "default")

    cluster.eventually(lambda: cluster.get_pod(kube_api, "second")["spec"].get("nodeName") == "n1", what="second bound")


def test_a_standby_takes_over_within_the_lease_and_nothing_is_allocated_twice(
    kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=4))
    cluster.add_node(kube_api, gpu_node("n2", gpus=4))
    cfg = cluster.config(kube_api, key_file, standalone=True, lease_s=LEASE_S)
    a = cluster.start(cfg, identity="sched-a")
    apps.append(a)
    cluster.eventually(a.is_leader, what="a leads")
    b = cluster.start(cfg, identity="sched-b")
    apps.append(b)
    for i in range(6):
        cluster.add_pod(kube_api, share_pod(f"early{i}", core=70, memory="30Gi", scheduler_name=names.SCHEDULER_NAME))
    cluster.eventually(lambda: sum(1 for p in pods_in(kube_api) if p["spec"].get("nodeName")) == 6, what="early binds")
    assert not b.is_leader()

    a.stop(1.0, release_lease=False)  # a crash: the lease is left to expire
    crashed_at = time.monotonic()
    for i in range(4):
        cluster.add_pod(kube_api, share_pod(f"late{i}", core=70, memory="30Gi", scheduler_name=names.SCHEDULER_NAME))
    cluster.eventually(b.is_leader, timeout_s=LEASE_S * 3, what="b leads")
    took = time.monotonic() - crashed_at
    cluster.eventually(lambda: sum(1 for p in pods_in(kube_api) if p["spec"].get("nodeName")) == 8, what="late binds")
    time.sleep(0.5)

    assert took < LEASE_S * 3
    use = gpu_use(kube_api)
    assert len(use) == 8 and all(v == 70 for v in use.values()), use
    assert sum(1 for p in pods_in(kube_api) if not p["spec"].get("nodeName")) == 2


def test_a_released_lease_is_taken_over_at_once(kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    cfg = cluster.config(kube_api, key_file, standalone=True, lease_s=30.0)
    a = cluster.start(cfg, identity="sched-a")
    apps.append(a)
    cluster.eventually(a.is_leader, what="a leads")
    b = cluster.start(cfg, identity="sched-b")
    apps.append(b)

    a.stop(1.0, release_lease=True)

    cluster.eventually(b.is_leader, timeout_s=5.0, what="b leads long before the 30 s lease would expire")
    cluster.add_pod(kube_api, whole_pod("after", scheduler_name=names.SCHEDULER_NAME))
    cluster.eventually(lambda: cluster.get_pod(kube_api, "after")["spec"].get("nodeName") == "n1", what="bound by b")


def _put_node(api: KubeAPIServer, name: str, *, unschedulable: bool = False, ready: str = "True") -> None:
    """A node with one GPU whose Node object says it is cordoned or not ready."""
    devices = gpu_node(name, gpus=1)
    node = api.put_object(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"unschedulable": unschedulable},
            "status": {
                "conditions": [{"type": "Ready", "status": ready}],
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            },
        },
    )
    api.put_object(cluster.DEVICES, to_device_object(devices, node_uid=node["metadata"]["uid"]))


def test_standalone_never_binds_to_a_cordoned_or_not_ready_node(kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]) -> None:
    cluster.install(kube_api)
    _put_node(kube_api, "cordoned", unschedulable=True)
    _put_node(kube_api, "not-ready", ready="False")
    _put_node(kube_api, "ok")
    apps.append(cluster.start(cluster.config(kube_api, key_file, standalone=True, lease_s=LEASE_S)))
    for i in range(3):
        cluster.add_pod(kube_api, whole_pod(f"p{i}", scheduler_name=names.SCHEDULER_NAME))

    cluster.eventually(lambda: any(p["spec"].get("nodeName") for p in pods_in(kube_api)), what="a bind")
    cluster.eventually(lambda: sum(1 for p in pods_in(kube_api) if not p["spec"].get("nodeName") and events_of(kube_api, p["metadata"]["name"])) == 2, what="events")

    assert {p["spec"].get("nodeName") for p in pods_in(kube_api)} == {"ok", None}


def test_a_pod_with_a_persistent_volume_claim_gets_a_failed_scheduling_event_and_stays_pending(
    kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    apps.append(cluster.start(cluster.config(kube_api, key_file, standalone=True, lease_s=LEASE_S)))
    pod = whole_pod("with-claim", scheduler_name=names.SCHEDULER_NAME)
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}}]
    cluster.add_pod(kube_api, pod)

    cluster.eventually(lambda: bool(events_of(kube_api, "with-claim")), what="event", timeout_s=5.0)

    (event,) = events_of(kube_api, "with-claim")
    assert event["reason"] == "FailedScheduling" and "PersistentVolumeClaim data-0" in event["message"]
    assert not cluster.get_pod(kube_api, "with-claim")["spec"].get("nodeName")
