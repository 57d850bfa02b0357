"""Create, read, update, delete for each kind the double serves, through the official client."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.kubeapi import KubeAPIServer
from tests.kubeapi_tests.objects import DEVICE_API, device, node, pod


def test_created_pod_gets_identity_defaults_and_pending_status(core: client.CoreV1Api) -> None:
    sent = pod("p1")
    sent["status"] = {"phase": "Running"}
    created = core.create_namespaced_pod("default", sent)
    assert created.metadata.uid
    assert created.metadata.namespace == "default"
    assert int(created.metadata.resource_version) > 0
    assert created.metadata.creation_timestamp is not None
    assert created.spec.scheduler_name == "default-scheduler"
    assert created.status.phase == "Pending"
    assert created.status.qos_class == "BestEffort"
    assert core.read_namespaced_pod("p1", "default").metadata.uid == created.metadata.uid


def test_creating_an_existing_name_is_409_already_exists(core: client.CoreV1Api) -> None:
    core.create_node(node("n1"))
    with pytest.raises(ApiException) as caught:
        core.create_node(node("n1"))
    assert caught.value.status == 409
    body = json.loads(caught.value.body)
    assert body["reason"] == "AlreadyExists"
    assert body["details"] == {"name": "n1", "kind": "nodes"}


def test_generate_name_gets_a_random_suffix(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", {**pod(""), "metadata": {"generateName": "job-"}})
    assert created.metadata.name.startswith("job-")
    assert len(created.metadata.name) == len("job-") + 5


def test_missing_name_is_422_invalid_naming_the_field(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(
            "default", {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        )
    assert caught.value.status == 422
    body = json.loads(caught.value.body)
    assert body["kind"] == "Status" and body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "metadata.name"


def test_reading_a_missing_object_is_404_with_a_status_body(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("nope", "default")
    assert caught.value.status == 404
    body = json.loads(caught.value.body)
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "kind": "pods"},
        "code": 404,
    }


def test_list_carries_the_cluster_resource_version(core: client.CoreV1Api) -> None:
    core.create_node(node("n1"))
    pod_rv = int(core.create_namespaced_pod("default", pod("p1")).metadata.resource_version)
    nodes = core.list_node()
    assert int(nodes.metadata.resource_version) == pod_rv
    assert [n.metadata.name for n in nodes.items] == ["n1"]


def test_update_with_a_stale_resource_version_is_409_conflict(core: client.CoreV1Api) -> None:
    first = core.create_node(node("n1"))
    first.metadata.labels = {"a": "1"}
    updated = core.replace_node("n1", first)
    assert int(updated.metadata.resource_version) > int(first.metadata.resource_version)
    first.metadata.labels = {"a": "2"}
    with pytest.raises(ApiException) as caught:
        core.replace_node("n1", first)
    assert caught.value.status == 409
    body = json.loads(caught.value.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["reason"] == "Conflict" and body["code"] == 409
    assert body["details"] == {"name": "n1", "kind": "nodes"}
    assert "the object has been modified" in body["message"]
    assert core.read_node("n1").metadata.labels == {"a": "1"}


def test_update_of_the_main_resource_ignores_status(core: client.CoreV1Api) -> None:
    created = core.create_node({**node("n1"), "status": {"capacity": {"cpu": "4"}}})
    created.status.capacity = {"cpu": "99"}
    assert core.replace_node("n1", created).status.capacity == {"cpu": "4"}
    created = core.read_node("n1")
    created.status.capacity = {"cpu": "8"}
    assert core.replace_node_status("n1", created).status.capacity == {"cpu": "8"}


def test_an_update_that_changes_nothing_keeps_the_resource_version(core: client.CoreV1Api) -> None:
    created = core.create_node(node("n1", labels={"a": "1"}))
    again = core.replace_node("n1", created)
    assert again.metadata.resource_version == created.metadata.resource_version


def test_pod_spec_is_immutable_except_images(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p1"))
    created.spec.node_name = "n1"
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_pod("p1", "default", created)
    assert caught.value.status == 422
    assert "pods/binding" in json.loads(caught.value.body)["message"]
    created = core.read_namespaced_pod("p1", "default")
    created.spec.containers[0].image = "busybox:2"
    assert core.replace_namespaced_pod("p1", "default", created).spec.containers[0].image == "busybox:2"


def test_deleting_a_pod_returns_it_and_deleting_a_node_returns_success(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p1"))
    core.create_node(node("n1"))
    assert core.delete_namespaced_pod("p1", "default").metadata.name == "p1"
    core.delete_node("n1")
    with pytest.raises(ApiException) as caught:
        core.read_node("n1")
    assert caught.value.status == 404
    assert core.list_namespaced_pod("default").items == []


def test_delete_with_a_stale_precondition_is_409(core: client.CoreV1Api) -> None:
    core.create_node(node("n1"))
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version="1"))
    with pytest.raises(ApiException) as caught:
        core.delete_node("n1", body=options)
    assert caught.value.status == 409


def test_events_round_trip_in_both_groups(api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    involved = client.V1ObjectReference(kind="Pod", name="p1", namespace="default")
    core.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="e1"), involved_object=involved, reason="Scheduled"
        ),
    )
    events = client.EventsV1Api(api_client)
    events.create_namespaced_event(
        "default",
        client.EventsV1Event(
            metadata=client.V1ObjectMeta(name="e2"),
            event_time="2024-01-01T00:00:00.000000Z",
            reason="Bound",
            action="Binding",
            reporting_controller="fgpu",
            reporting_instance="x",
        ),
    )
    assert [e.reason for e in core.list_namespaced_event("default").items] == ["Scheduled"]
    assert [e.reason for e in events.list_namespaced_event("default").items] == ["Bound"]
    selected = core.list_event_for_all_namespaces(field_selector="involvedObject.name=p1")
    assert [e.metadata.name for e in selected.items] == ["e1"]


def test_leases_support_optimistic_leader_election(api_client: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api_client)
    spec = client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15)
    created = leases.create_namespaced_lease(
        "kube-system", client.V1Lease(metadata=client.V1ObjectMeta(name="l"), spec=spec)
    )
    created.spec.holder_identity = "b"
    leases.replace_namespaced_lease("l", "kube-system", created)
    created.spec.holder_identity = "c"
    with pytest.raises(ApiException) as caught:
        leases.replace_namespaced_lease("l", "kube-system", created)
    assert caught.value.status == 409
    assert leases.read_namespaced_lease("l", "kube-system").spec.holder_identity == "b"


def test_cluster_scoped_devices_are_served_once_the_crd_is_installed(custom: client.CustomObjectsApi) -> None:
    created = custom.create_cluster_custom_object(*DEVICE_API, device("n1", minors=2))
    assert created["metadata"]["resourceVersion"]
    assert created["metadata"]["generation"] == 1
    got = custom.get_cluster_custom_object(*DEVICE_API, "n1")
    assert [d["minor"] for d in got["spec"]["devices"]] == [0, 1]
    listed = custom.list_cluster_custom_object(*DEVICE_API)
    assert listed["kind"] == "DeviceList" and listed["metadata"]["resourceVersion"]
    assert [i["metadata"]["name"] for i in listed["items"]] == ["n1"]
    got["spec"]["devices"] = got["spec"]["devices"][:1]
    replaced = custom.replace_cluster_custom_object(*DEVICE_API, "n1", got)
    assert replaced["metadata"]["generation"] == 2
    custom.delete_cluster_custom_object(*DEVICE_API, "n1")
    assert custom.list_cluster_custom_object(*DEVICE_API)["items"] == []


def test_custom_resources_are_pruned_defaulted_and_validated_by_their_schema(
    custom: client.CustomObjectsApi,
) -> None:
    sent = device("n1")
    sent["spec"]["devices"][0]["nvlinkPeers"] = ["GPU-9"]
    del sent["spec"]["devices"][0]["health"]
    sent["spec"]["devices"][0]["health"] = False
    created = custom.create_cluster_custom_object(*DEVICE_API, sent)
    assert "nvlinkPeers" not in created["spec"]["devices"][0]
    bad = device("n2")
    bad["spec"]["devices"][0]["minor"] = "zero"
    with pytest.raises(ApiException) as caught:
        custom.create_cluster_custom_object(*DEVICE_API, bad)
    assert caught.value.status == 422
    assert "spec.devices[0].minor" in json.loads(caught.value.body)["message"]


def test_namespaced_custom_resources_from_a_crd_created_through_the_api(
    kube_api: KubeAPIServer, api_client: client.ApiClient
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
    client.ApiextensionsV1Api(api_client).create_custom_resource_definition(crd)
    objects = client.CustomObjectsApi(api_client)
    widget = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 3},
        "status": {"ready": True},
    }
    created = objects.create_namespaced_custom_object("example.com", "v1", "default", "widgets", widget)
    assert "status" not in created
    objects.patch_namespaced_custom_object_status(
        "example.com", "v1", "default", "widgets", "w", {"status": {"ready": True}}
    )
    stored = kube_api.get_object("/apis/example.com/v1/namespaces/default/widgets/w")
    assert stored is not None and stored["status"] == {"ready": True} and stored["spec"] == {"size": 3}


def test_seeded_objects_are_visible_through_the_api(kube_api: KubeAPIServer, core: client.CoreV1Api) -> None:
    seeded = kube_api.put_object(
        "/api/v1/namespaces/default/pods", {**pod("p1"), "status": {"phase": "Running"}}
    )
    assert seeded["metadata"]["uid"] and seeded["metadata"]["resourceVersion"]
    assert core.read_namespaced_pod("p1", "default").status.phase == "Running"
    assert kube_api.get_object("/api/v1/namespaces/default/pods/p1") is not None
    assert kube_api.get_object("/api/v1/namespaces/default/pods/p2") is None


def test_deleting_a_custom_object_answers_a_success_status(custom: client.CustomObjectsApi) -> None:
    created = custom.create_cluster_custom_object(*DEVICE_API, device("n1"))
    answer = custom.delete_cluster_custom_object(*DEVICE_API, "n1")
    assert answer["kind"] == "Status" and answer["status"] == "Success"
    assert answer["details"] == {
        "name": "n1",
        "kind": "devices",
        "group": "scheduling.koordinator.sh",
        "uid": created["metadata"]["uid"],
    }
