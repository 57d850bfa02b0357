"""Binding pods to nodes, and deletion with finalizers."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.kubeapi_tests.objects import pod
from tests.kubeapi_tests.watching import collect


def _bind(core: client.CoreV1Api, name: str, node: str) -> None:
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name, annotations={"fgpu.io/x": "1"}),
        target=client.V1ObjectReference(kind="Node", name=node),
    )
    # The server answers a Status, which the client cannot read as a V1Binding (as with a real cluster).
    response = core.create_namespaced_pod_binding(name, "default", body, _preload_content=False)
    assert response.status == 201
    assert json.loads(response.data)["status"] == "Success"


def test_binding_sets_the_node_the_annotations_and_pod_scheduled(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    _bind(core, "p1", "n1")
    bound = core.read_namespaced_pod("p1", "default")
    assert bound.spec.node_name == "n1"
    assert bound.metadata.annotations == {"fgpu.io/x": "1"}
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]


def test_binding_an_already_bound_pod_is_409(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    _bind(core, "p1", "n1")
    with pytest.raises(ApiException) as caught:
        _bind(core, "p1", "n2")
    assert caught.value.status == 409
    assert 'already assigned to node "n1"' in json.loads(caught.value.body)["message"]
    assert core.read_namespaced_pod("p1", "default").spec.node_name == "n1"


def test_binding_through_the_bindings_collection(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name="p1"), target=client.V1ObjectReference(name="n1")
    )
    core.create_namespaced_binding("default", body, _preload_content=False)
    assert core.read_namespaced_pod("p1", "default").spec.node_name == "n1"


def test_binding_a_missing_pod_is_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        _bind(core, "ghost", "n1")
    assert caught.value.status == 404


def test_a_pod_with_finalizers_is_marked_then_removed_when_they_are_gone(core: client.CoreV1Api) -> None:
    rv = core.create_namespaced_pod(
        "default", pod("p1", finalizers=["fgpu.io/release"])
    ).metadata.resource_version
    marked = core.delete_namespaced_pod("p1", "default")
    assert marked.metadata.deletion_timestamp is not None
    assert core.read_namespaced_pod("p1", "default").metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_pod("p1", "default", {"metadata": {"finalizers": ["fgpu.io/release", "other"]}})
    assert caught.value.status == 422
    core.patch_namespaced_pod("p1", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("p1", "default")
    assert gone.value.status == 404
    assert collect(core.list_namespaced_pod, "default", count=2, resource_version=rv) == [
        ("MODIFIED", "p1"),
        ("DELETED", "p1"),
    ]


def test_deletion_of_an_object_without_finalizers_is_immediate(core: client.CoreV1Api) -> None:
    rv = core.create_namespaced_pod("default", pod("p1")).metadata.resource_version
    core.delete_namespaced_pod("p1", "default")
    assert core.list_namespaced_pod("default").items == []
    assert collect(core.list_namespaced_pod, "default", count=1, resource_version=rv) == [("DELETED", "p1")]


def test_delete_collection_removes_the_selected_pods(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("a", labels={"job": "x"}))
    core.create_namespaced_pod("default", pod("b", labels={"job": "y"}))
    core.delete_collection_namespaced_pod("default", label_selector="job=x")
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["b"]
