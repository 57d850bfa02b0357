"""A Binding's uid and resourceVersion are preconditions on the pod, as in BindingREST.setPodHostAndAnnotations."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.kubeapi_tests.objects import pod


def _bind(core: client.CoreV1Api, name: str, node: str, **meta: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "annotations": {"fgpu.io/x": node}, **meta},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    core.create_namespaced_pod_binding(name, "default", body, _preload_content=False)


def test_a_binding_with_the_pods_current_resource_version_binds_it(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p1"))

    _bind(core, "p1", "n1", uid=created.metadata.uid, resourceVersion=created.metadata.resource_version)

    bound = core.read_namespaced_pod("p1", "default")
    assert (bound.spec.node_name, bound.metadata.annotations) == ("n1", {"fgpu.io/x": "n1"})


def test_a_binding_with_a_stale_resource_version_is_409_and_writes_nothing(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p1"))
    changed = core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"touched": "yes"}}})

    with pytest.raises(ApiException) as caught:
        _bind(core, "p1", "n1", resourceVersion=created.metadata.resource_version)

    assert caught.value.status == 409
    status = json.loads(caught.value.body)
    assert status["reason"] == "Conflict"
    assert (
        f"Precondition failed: ResourceVersion in precondition: {created.metadata.resource_version}, "
        f"ResourceVersion in object meta: {changed.metadata.resource_version}"
    ) in status["message"]
    unbound = core.read_namespaced_pod("p1", "default")
    assert not unbound.spec.node_name and not (unbound.metadata.annotations or {})


def test_a_binding_for_another_uid_is_409(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p1"))

    with pytest.raises(ApiException) as caught:
        _bind(core, "p1", "n1", uid="not-this-pod")

    assert caught.value.status == 409
    assert "Precondition failed: UID in precondition: not-this-pod" in json.loads(caught.value.body)["message"]
