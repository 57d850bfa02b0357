"""List with label and field selectors, and paginated lists whose continue token can expire."""

from __future__ import annotations

import json

import kubernetes
import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.kubeapi import KubeAPIServer, selectors
from tests.kubeapi_tests.objects import node, pod


@pytest.fixture
def labelled(core: client.CoreV1Api) -> client.CoreV1Api:
    core.create_node(node("a100", labels={"model": "A100", "zone": "z1"}))
    core.create_node(node("h100", labels={"model": "H100", "zone": "z2"}))
    core.create_node(node("cpu", labels={"zone": "z1"}))
    return core


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("model=A100", ["a100"]),
        ("model==A100", ["a100"]),
        ("model!=A100", ["cpu", "h100"]),
        ("model in (A100,H100)", ["a100", "h100"]),
        ("model notin (A100)", ["cpu", "h100"]),
        ("model", ["a100", "h100"]),
        ("!model", ["cpu"]),
        ("zone=z1,model", ["a100"]),
    ],
)
def test_label_selectors_on_list(labelled: client.CoreV1Api, selector: str, expected: list[str]) -> None:
    assert [n.metadata.name for n in labelled.list_node(label_selector=selector).items] == expected


def test_a_malformed_label_selector_is_400(labelled: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        labelled.list_node(label_selector="model in A100")
    assert caught.value.status == 400


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=n1", ["bound"]),
        ("spec.nodeName=", ["running", "unbound"]),
        ("spec.nodeName!=", ["bound"]),
        ("status.phase=Running", ["running"]),
        ("metadata.name=unbound", ["unbound"]),
        ("metadata.namespace=default,spec.nodeName=n1", ["bound"]),
    ],
)
def test_field_selectors_on_pods(
    kube_api: KubeAPIServer, core: client.CoreV1Api, selector: str, expected: list[str]
) -> None:
    core.create_namespaced_pod("default", pod("unbound"))
    core.create_namespaced_pod("default", pod("bound", node="n1"))
    kube_api.put_object("/api/v1/namespaces/default/pods", {**pod("running"), "status": {"phase": "Running"}})
    names = [p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector=selector).items]
    assert names == expected


def test_an_unsupported_field_selector_is_400_naming_the_label(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_node(field_selector="spec.podCIDR=x")
    assert caught.value.status == 400
    assert "spec.podCIDR" in json.loads(caught.value.body)["message"]


def test_namespaced_list_sees_only_its_namespace(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("a"))
    core.create_namespaced_pod("kube-system", pod("b"))
    assert [p.metadata.name for p in core.list_namespaced_pod("kube-system").items] == ["b"]
    assert len(core.list_pod_for_all_namespaces().items) == 2


def test_paginated_list_returns_every_object_once_from_one_snapshot(core: client.CoreV1Api) -> None:
    for i in range(5):
        core.create_node(node(f"n{i}"))
    first = core.list_node(limit=2)
    core.create_node(node("late"))
    second = core.list_node(limit=2, _continue=first.metadata._continue)
    third = core.list_node(limit=2, _continue=second.metadata._continue)
    names = [n.metadata.name for page in (first, second, third) for n in page.items]
    assert names == ["n0", "n1", "n2", "n3", "n4"]
    assert third.metadata._continue is None
    assert first.metadata.remaining_item_count == 3


def test_a_continue_token_older_than_the_history_is_410() -> None:
    with KubeAPIServer(history=2) as api:
        core = client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=api.kubeconfig_path))
        for i in range(3):
            core.create_node(node(f"n{i}"))
        first = core.list_node(limit=1)
        for i in range(3):
            core.create_namespaced_pod("default", pod(f"p{i}"))
        with pytest.raises(ApiException) as caught:
            core.list_node(limit=1, _continue=first.metadata._continue)
        assert caught.value.status == 410
        assert json.loads(caught.value.body)["reason"] == "Expired"


def test_selector_parser_reads_set_based_requirements() -> None:
    parsed = selectors.parse_labels("a in (x, y),!b,c>3")
    assert parsed.matches({"a": "y", "c": "4"})
    assert not parsed.matches({"a": "y", "b": "", "c": "4"})
    assert not parsed.matches({"a": "y", "c": "3"})
