"""Fault injection and restarts, seen through the official client."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client import ApiException

from tests.kubeapi import KubeAPIServer
from tests.kubeapi_tests.objects import DEVICE_API, device, node, pod
from tests.kubeapi_tests.watching import collect


@pytest.mark.parametrize("status", [500, 503])
def test_fail_next_fails_exactly_the_next_calls_with_the_status(
    kube_api: KubeAPIServer, core: client.CoreV1Api, status: int
) -> None:
    kube_api.fail_next(2, status=status)
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            core.list_node()
        assert caught.value.status == status
        assert json.loads(caught.value.body)["kind"] == "Status"
    assert core.list_node().items == []


def test_fail_next_only_hits_calls_whose_path_matches(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    kube_api.fail_next(1, status=500, path_contains="/nodes")
    core.list_namespaced_pod("default")
    with pytest.raises(ApiException):
        core.list_node()
    core.list_node()


def test_a_hung_call_times_out_in_the_client(kube_api: KubeAPIServer, core: client.CoreV1Api) -> None:
    kube_api.fail_next(1, timeout=True, path_contains="/pods")
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        core.create_namespaced_pod("default", pod("p1"), _request_timeout=0.3)
    assert core.create_namespaced_pod("default", pod("p2")).metadata.name == "p2"


def test_a_paused_server_times_calls_out_and_answers_again_after_resume(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    kube_api.pause()
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        core.list_node(_request_timeout=0.2)
    late: list[str] = []
    caller = threading.Thread(target=lambda: late.append(core.create_node(node("n1")).metadata.name))
    caller.start()
    caller.join(timeout=0.3)
    assert late == []
    kube_api.resume()
    caller.join(timeout=10)
    assert late == ["n1"]


def test_dropped_watches_break_the_stream_and_a_rewatch_loses_nothing(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    rv = core.list_node().metadata.resource_version
    stream = watch.Watch().stream(core.list_node, resource_version=rv, timeout_seconds=10)
    core.create_node(node("n1"))
    first = next(stream)
    assert first["type"] == "ADDED"
    kube_api.drop_watches()
    core.create_node(node("n2"))
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for _ in stream:
            pass
    resumed = collect(core.list_node, count=1, resource_version=first["object"].metadata.resource_version)
    assert resumed == [("ADDED", "n2")]


def test_restart_keeping_state_serves_the_same_objects_at_the_same_url(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    url = kube_api.url
    rv = core.create_node(node("n1")).metadata.resource_version
    kube_api.restart()
    assert kube_api.url == url
    assert [n.metadata.name for n in core.list_node().items] == ["n1"]
    core.create_node(node("n2"))
    assert collect(core.list_node, count=1, resource_version=rv) == [("ADDED", "n2")]


def test_restart_without_state_loses_objects_keeps_crds_and_expires_old_versions(
    kube_api: KubeAPIServer, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    rv = core.create_node(node("n1")).metadata.resource_version
    custom.create_cluster_custom_object(*DEVICE_API, device("n1"))
    kube_api.restart(keep_state=False)
    assert core.list_node().items == []
    assert custom.list_cluster_custom_object(*DEVICE_API)["items"] == []
    with pytest.raises(ApiException) as caught:
        collect(core.list_node, count=1, resource_version=rv)
    assert caught.value.status == 410
    assert int(core.create_node(node("n2")).metadata.resource_version) > int(rv)


def test_garbage_requests_get_errors_and_the_server_keeps_serving(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    bad = urllib.request.Request(
        f"{kube_api.url}/api/v1/nodes",
        data=b"{not json",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(bad, timeout=5)
    assert caught.value.code == 400
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{kube_api.url}/apis/nope.example.com/v1/things", timeout=5)
    assert missing.value.code == 404
    assert core.list_node().items == []
