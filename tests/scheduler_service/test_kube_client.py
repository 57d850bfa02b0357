"""The scheduler's Kubernetes seam (scheduler_plugin/kube.py) against the API double."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_plugin.errors import KubeAPIError, WatchExpired
from scheduler_plugin.kube import Kube
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, whole_pod


def test_a_missing_kubeconfig_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(KubeAPIError, match=r"--kubeconfig='.*nope': cannot load"):
        Kube.connect(kubeconfig=str(tmp_path / "nope"))


def test_server_errors_carry_status_and_message(kube_api: KubeAPIServer) -> None:
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path)
    kube_api.fail_next(1, status=503, path_contains="/pods")

    with pytest.raises(KubeAPIError) as caught:
        kube.list_pods()

    assert caught.value.status == 503
    assert kube.get_pod(namespace="default", name="absent") is None
    kube.close()


def test_a_hung_api_server_costs_the_request_timeout_not_forever(kube_api: KubeAPIServer) -> None:
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=0.5)
    kube_api.pause()
    try:
        with pytest.raises(KubeAPIError, match="unreachable"):
            kube.list_nodes()
    finally:
        kube_api.resume()
        kube.close()


def test_a_watch_from_a_compacted_version_raises_watch_expired(kube_api: KubeAPIServer) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    cluster.add_pod(kube_api, whole_pod("p"))
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path)
    kube_api.restart(keep_state=False)  # compacts the history, as after an etcd restore

    with pytest.raises(WatchExpired, match="410"):
        for _ in kube.watch_pods(resource_version="1", timeout_s=2):
            pass
    kube.close()


def test_a_watch_delivers_changes_after_the_listed_version(kube_api: KubeAPIServer) -> None:
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path)
    listed = kube.list_pods()
    cluster.add_pod(kube_api, whole_pod("new"))

    events = [(e.type, e.obj["metadata"]["name"]) for e in kube.watch_pods(resource_version=listed.resource_version, timeout_s=1)
              if e.type != "BOOKMARK"]

    assert events == [("ADDED", "new")]
    kube.close()
