"""Each patch type as the client sends it, and strategic merge semantics table-driven on the pure functions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.kubeapi import patching
from tests.kubeapi_tests.objects import DEVICE_API, device, node, pod


def test_dict_patch_of_node_status_is_a_strategic_merge_by_condition_type(core: client.CoreV1Api) -> None:
    core.create_node(node("n1"))
    core.patch_node_status(
        "n1",
        {
            "status": {
                "capacity": {"cpu": "4", "koordinator.sh/gpu-core": "200"},
                "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "DiskPressure", "status": "False"},
                ],
            }
        },
    )
    patched = core.patch_node_status(
        "n1",
        {
            "status": {
                "capacity": {"koordinator.sh/gpu-core": None},
                "allocatable": {"koordinator.sh/gpu-core": "100"},
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        },
    )
    assert patched.status.capacity == {"cpu": "4"}
    assert patched.status.allocatable == {"koordinator.sh/gpu-core": "100"}
    assert [(c.type, c.status) for c in patched.status.conditions] == [
        ("Ready", "True"),
        ("DiskPressure", "False"),
    ]


def test_strategic_merge_of_labels_keeps_the_others_and_null_deletes(core: client.CoreV1Api) -> None:
    core.create_node(node("n1", labels={"a": "1", "b": "2"}))
    patched = core.patch_node("n1", {"metadata": {"labels": {"b": None, "c": "3"}}})
    assert patched.metadata.labels == {"a": "1", "c": "3"}


def test_strategic_merge_of_owner_references_merges_by_uid(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    owner = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}
    core.patch_namespaced_pod("p1", "default", {"metadata": {"ownerReferences": [owner]}})
    other = {**owner, "name": "n2", "uid": "u2"}
    patched = core.patch_namespaced_pod("p1", "default", {"metadata": {"ownerReferences": [other]}})
    assert [o.uid for o in patched.metadata.owner_references] == ["u1", "u2"]


def test_json_patch_is_sent_for_a_list_body_and_applied_in_order(core: client.CoreV1Api) -> None:
    core.create_node(node("n1", labels={"a": "1"}))
    patched = core.patch_node(
        "n1",
        [
            {"op": "test", "path": "/metadata/labels/a", "value": "1"},
            {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
            {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}},
        ],
    )
    assert patched.metadata.labels == {"a": "2"}
    assert patched.metadata.annotations == {"x": "y"}


def test_a_failing_json_patch_test_op_is_422_and_changes_nothing(core: client.CoreV1Api) -> None:
    created = core.create_node(node("n1", labels={"a": "1"}))
    with pytest.raises(ApiException) as caught:
        core.patch_node(
            "n1",
            [
                {"op": "test", "path": "/metadata/labels/a", "value": "9"},
                {"op": "remove", "path": "/metadata/labels/a"},
            ],
        )
    assert caught.value.status == 422
    assert core.read_node("n1").metadata.resource_version == created.metadata.resource_version


def test_custom_objects_take_merge_patch_and_refuse_strategic_merge(custom: client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(*DEVICE_API, device("n1", minors=2))
    patched = custom.patch_cluster_custom_object(
        *DEVICE_API,
        "n1",
        {"metadata": {"labels": {"a": "b"}}, "spec": {"devices": [{"minor": 7, "health": True}]}},
    )
    assert patched["metadata"]["labels"] == {"a": "b"}
    assert [d["minor"] for d in patched["spec"]["devices"]] == [7]
    with pytest.raises(ApiException) as caught:
        custom.patch_cluster_custom_object(
            *DEVICE_API, "n1", {"spec": {}}, _content_type="application/strategic-merge-patch+json"
        )
    assert caught.value.status == 415


def test_a_patch_carrying_a_stale_resource_version_is_409(core: client.CoreV1Api) -> None:
    created = core.create_node(node("n1"))
    core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
    with pytest.raises(ApiException) as caught:
        core.patch_node(
            "n1", {"metadata": {"labels": {"a": "2"}, "resourceVersion": created.metadata.resource_version}}
        )
    assert caught.value.status == 409
    assert json.loads(caught.value.body)["reason"] == "Conflict"


SMP_CASES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    (
        "conditions merge by type and new ones append",
        {"status": {"conditions": [{"type": "A", "status": "True"}]}},
        {"status": {"conditions": [{"type": "B", "status": "False"}]}},
        {"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "False"}]}},
    ),
    (
        "$patch delete removes the element with that key",
        {"status": {"conditions": [{"type": "A"}, {"type": "B"}]}},
        {"status": {"conditions": [{"type": "A", "$patch": "delete"}]}},
        {"status": {"conditions": [{"type": "B"}]}},
    ),
    (
        "$patch replace in a list replaces the list",
        {"status": {"conditions": [{"type": "A"}, {"type": "B"}]}},
        {"status": {"conditions": [{"$patch": "replace"}, {"type": "C"}]}},
        {"status": {"conditions": [{"type": "C"}]}},
    ),
    (
        "$patch replace on a map replaces the map",
        {"metadata": {"labels": {"a": "1"}}},
        {"metadata": {"labels": {"b": "2", "$patch": "replace"}}},
        {"metadata": {"labels": {"b": "2"}}},
    ),
    (
        "finalizers take the union",
        {"metadata": {"finalizers": ["a"]}},
        {"metadata": {"finalizers": ["b", "a"]}},
        {"metadata": {"finalizers": ["a", "b"]}},
    ),
    (
        "$deleteFromPrimitiveList removes finalizers",
        {"metadata": {"finalizers": ["a", "b"]}},
        {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
        {"metadata": {"finalizers": ["b"]}},
    ),
    (
        "lists without a merge strategy are replaced",
        {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}},
        {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}},
        {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}},
    ),
    (
        "container env merges by name inside containers merged by name",
        {"spec": {"containers": [{"name": "c", "env": [{"name": "A", "value": "1"}]}]}},
        {"spec": {"containers": [{"name": "c", "env": [{"name": "B", "value": "2"}]}]}},
        {
            "spec": {
                "containers": [
                    {"name": "c", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
                ]
            }
        },
    ),
]


@pytest.mark.parametrize(("case", "original", "patch", "expected"), SMP_CASES, ids=[c[0] for c in SMP_CASES])
def test_strategic_merge_patch_semantics(
    case: str, original: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]
) -> None:
    kind = "Node" if "taints" in json.dumps(original) else "Pod"
    assert patching.strategic_merge_patch(original, patch, kind=kind) == expected


def test_merge_patch_replaces_lists_and_deletes_nulls() -> None:
    original = {"a": [1, 2], "b": {"c": 1, "d": 2}}
    assert patching.merge_patch(original, {"a": [3], "b": {"c": None}}) == {"a": [3], "b": {"d": 2}}
