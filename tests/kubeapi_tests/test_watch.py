"""Watch through `kubernetes.watch.Watch`: resume, 410 after compaction, bookmarks, selectors, timeouts."""

from __future__ import annotations

import json
import threading
import time

import kubernetes
import pytest
from kubernetes import client, watch
from kubernetes.client import ApiException

from tests.kubeapi import KubeAPIServer
from tests.kubeapi_tests.objects import DEVICE_API, device, node, pod
from tests.kubeapi_tests.watching import collect


def test_watch_from_a_list_resource_version_streams_only_later_changes(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("before"))
    listed = core.list_namespaced_pod("default")
    core.create_namespaced_pod("default", pod("after"))
    core.patch_namespaced_pod("after", "default", {"metadata": {"labels": {"x": "1"}}})
    core.delete_namespaced_pod("before", "default")
    events = collect(
        core.list_namespaced_pod, "default", count=3, resource_version=listed.metadata.resource_version
    )
    assert events == [("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "before")]


def test_watch_resumes_after_the_resource_version_of_an_event(core: client.CoreV1Api) -> None:
    first = core.create_node(node("n1"))
    core.create_node(node("n2"))
    events = collect(core.list_node, count=1, resource_version=first.metadata.resource_version)
    assert events == [("ADDED", "n2")]


def test_watch_without_resource_version_starts_with_the_current_objects(core: client.CoreV1Api) -> None:
    core.create_node(node("n1"))
    core.create_node(node("n2"))
    assert collect(core.list_node, count=2) == [("ADDED", "n1"), ("ADDED", "n2")]


def test_watch_delivers_changes_made_while_it_is_open(core: client.CoreV1Api) -> None:
    rv = core.list_node().metadata.resource_version
    events: list[tuple[str, object]] = []
    watcher = threading.Thread(
        target=lambda: events.extend(collect(core.list_node, count=2, resource_version=rv))
    )
    watcher.start()
    core.create_node(node("n1"))
    core.delete_node("n1")
    watcher.join(timeout=10)
    assert events == [("ADDED", "n1"), ("DELETED", "n1")]


def test_watch_from_a_compacted_resource_version_fails_with_410_gone() -> None:
    with KubeAPIServer(history=3) as api:
        core = client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=api.kubeconfig_path))
        old = core.create_node(node("n0")).metadata.resource_version
        for i in range(1, 6):
            core.create_node(node(f"n{i}"))
        with pytest.raises(ApiException) as caught:
            collect(core.list_node, count=1, resource_version=old)
        assert caught.value.status == 410
        raw = core.list_node(watch=True, resource_version=old, timeout_seconds=1, _preload_content=False)
        first = json.loads(raw.readline())
        assert first["type"] == "ERROR"
        assert first["object"]["code"] == 410 and first["object"]["reason"] == "Expired"


def test_client_watch_retries_a_410_once_then_raises_it() -> None:
    # Watch retries once after a 410 from its last resourceVersion, then raises: what callers must handle.
    with KubeAPIServer(history=2) as api:
        core = client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=api.kubeconfig_path))
        old = core.create_node(node("n0")).metadata.resource_version
        for i in range(1, 5):
            core.create_node(node(f"n{i}"))
        with pytest.raises(ApiException) as caught:
            for _ in watch.Watch().stream(core.list_node, resource_version=old):
                pass
        assert caught.value.status == 410


def test_bookmarks_arrive_when_asked_and_carry_the_latest_resource_version() -> None:
    with KubeAPIServer(bookmark_interval_s=0.05) as api:
        core = client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=api.kubeconfig_path))
        rv = core.create_node(node("n1")).metadata.resource_version
        events = collect(core.list_node, count=3, resource_version=rv, allow_watch_bookmarks=True)
        assert [t for t, _ in events] == ["BOOKMARK"] * 3
        assert {value for _, value in events} == {rv}
        plain = collect(core.list_node, count=1, timeout_s=1, resource_version=rv)
        assert plain == []


def test_label_selected_watch_sees_objects_enter_and_leave_the_selection(core: client.CoreV1Api) -> None:
    rv = core.list_node().metadata.resource_version
    core.create_node(node("n1", labels={"gpu": "yes"}))
    core.create_node(node("n2"))
    core.patch_node("n2", {"metadata": {"labels": {"gpu": "yes"}}})
    core.patch_node("n1", {"metadata": {"labels": {"gpu": "no"}}})
    events = collect(core.list_node, count=3, resource_version=rv, label_selector="gpu=yes")
    assert events == [("ADDED", "n1"), ("ADDED", "n2"), ("DELETED", "n1")]


def test_field_selected_watch_sees_only_pods_bound_to_the_node(core: client.CoreV1Api) -> None:
    rv = core.list_pod_for_all_namespaces().metadata.resource_version
    core.create_namespaced_pod("default", pod("elsewhere", node="n2"))
    core.create_namespaced_pod("default", pod("pending"))
    core.create_namespaced_pod("default", pod("here", node="n1"))
    events = collect(
        core.list_pod_for_all_namespaces, count=1, resource_version=rv, field_selector="spec.nodeName=n1"
    )
    assert events == [("ADDED", "here")]


def test_watch_ends_when_its_timeout_seconds_pass(core: client.CoreV1Api) -> None:
    rv = core.list_node().metadata.resource_version
    assert collect(core.list_node, count=1, timeout_s=1, resource_version=rv) == []


def test_watch_of_devices_through_custom_objects(custom: client.CustomObjectsApi) -> None:
    rv = custom.list_cluster_custom_object(*DEVICE_API)["metadata"]["resourceVersion"]
    custom.create_cluster_custom_object(*DEVICE_API, device("n1"))
    events = collect(custom.list_cluster_custom_object, *DEVICE_API, count=1, resource_version=rv)
    assert events == [("ADDED", "n1")]


def test_resource_versions_are_one_cluster_wide_increasing_counter(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    versions = [
        int(core.create_node(node("n1")).metadata.resource_version),
        int(custom.create_cluster_custom_object(*DEVICE_API, device("n1"))["metadata"]["resourceVersion"]),
        int(core.create_namespaced_pod("default", pod("p1")).metadata.resource_version),
        int(core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}}).metadata.resource_version),
    ]
    assert versions == sorted(versions) and len(set(versions)) == 4


def test_a_watch_closed_by_its_client_is_released_on_the_server(
    kube_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    stream = watch.Watch().stream(core.list_node, timeout_seconds=30)
    core.create_node(node("n1"))
    assert next(stream)["type"] == "ADDED"
    assert kube_api.open_watches == 1
    stream.close()
    deadline = time.monotonic() + 5
    while kube_api.open_watches and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kube_api.open_watches == 0


def test_send_initial_events_ends_the_initial_list_with_an_annotated_bookmark(core: client.CoreV1Api) -> None:
    core.create_node(node("n1"))
    raw = core.list_node(
        watch=True,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=1,
        _preload_content=False,
    )
    first, second = json.loads(raw.readline()), json.loads(raw.readline())
    raw.close()
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "n1")
    assert second["type"] == "BOOKMARK"
    assert second["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
