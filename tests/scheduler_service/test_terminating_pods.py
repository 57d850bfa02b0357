"""A terminating pod keeps its GPU share until its kubelet confirms, as kube-scheduler counts it until deleted."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes
import pytest
from kubernetes import client

from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.errors import Unschedulable
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, share_pod
from tests.scheduler_service.views import state_of


@pytest.fixture
def graceful_api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer(graceful_pod_deletion=True) as server:
        yield server


@pytest.fixture
def app(graceful_api: KubeAPIServer, key_file: str) -> Iterator[SchedulerApp]:
    cluster.install(graceful_api)
    cluster.add_node(graceful_api, gpu_node("n1", gpus=1))
    cluster.add_node(graceful_api, gpu_node("n2", gpus=1))
    started = cluster.start(cluster.config(graceful_api, key_file))
    yield started
    started.stop(1.0)


def _seen_bound(app: SchedulerApp, uid: str) -> bool:
    """The pod informer has counted the pod from the API (its reservation is no longer merely assumed)."""
    assert app.service is not None
    return any(p.uid == uid and not p.assumed for v in app.service.node_views() for g in v.gpus for p in g.pods)


def test_a_deleted_pod_holds_its_gpu_share_until_the_kubelet_confirms(graceful_api: KubeAPIServer, app: SchedulerApp) -> None:
    service = app.service
    assert service is not None
    old = service.bind(cluster.add_pod(graceful_api, share_pod("old", core=60, memory="40Gi")), "n1")
    old_uid = cluster.get_pod(graceful_api, "old")["metadata"]["uid"]
    cluster.eventually(lambda: _seen_bound(app, old_uid), what="old pod seen bound")

    api = kubernetes.config.new_client_from_config(config_file=graceful_api.kubeconfig_path)
    try:
        client.CoreV1Api(api).delete_namespaced_pod("old", "default")
    finally:
        api.close()
    assert cluster.get_pod(graceful_api, "old")["metadata"]["deletionTimestamp"]
    # Watch events arrive in order: once a later bind is seen, so is the deletionTimestamp.
    service.bind(cluster.add_pod(graceful_api, share_pod("marker", core=10, memory="1Gi")), "n2")
    marker_uid = cluster.get_pod(graceful_api, "marker")["metadata"]["uid"]
    cluster.eventually(lambda: _seen_bound(app, marker_uid), what="marker pod seen bound")

    assert service.allocation_of(old_uid) == ("n1", old.allocation)
    assert state_of(service)["n1"]["GPU-n1-00"][0] == 60
    newcomer = cluster.add_pod(graceful_api, share_pod("new", core=60, memory="40Gi"))
    with pytest.raises(Unschedulable):
        service.bind(newcomer, "n1")

    graceful_api.kubelet_confirm_deletion("default", "old")
    cluster.eventually(lambda: service.allocation_of(old_uid) is None, what="share freed after the kubelet confirmed")
    assert service.bind(cluster.get_pod(graceful_api, "new"), "n1").node == "n1"
