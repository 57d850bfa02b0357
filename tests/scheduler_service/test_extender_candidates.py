"""The extender's candidate lists as Go encodes them, and bind's filter cache (embedded state, no HTTP).

kube-scheduler writes a nil slice as `null` and an empty one as `[]`; neither means "every node".
Without the API, bind binds the pod a filter call carried: the one with the namespace, name and
UID bind names, never another pod filtered under the same UID.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from apis import names
from apis.allocation import decode_allocation
from scheduler_plugin.errors import InvalidRequest
from scheduler_plugin.extender import Extender
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import gpu_node, pod, share_pod, t4_node

Build = Callable[[], SchedulingService]


@pytest.fixture
def service(embedded_service: Build) -> SchedulingService:
    built = embedded_service()
    built.report_devices(gpu_node("n1", gpus=2))
    built.report_devices(t4_node("n2", gpus=1))
    return built


@pytest.fixture
def extender(service: SchedulingService) -> Extender:
    return Extender(service, pods_from_api=False)


def node_list(*names_: str) -> dict[str, Any]:
    return {"metadata": {}, "items": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in names_]}


GPU_POD = share_pod("gpu", core=50, memory="1Gi")
CPU_POD = pod("cpu")


@pytest.mark.parametrize("the_pod", [GPU_POD, CPU_POD], ids=["gpu-pod", "cpu-pod"])
def test_filter_of_no_node_names_answers_no_node(extender: Extender, the_pod: dict[str, Any]) -> None:
    result = extender.filter({"Pod": the_pod, "NodeNames": []})

    assert result["NodeNames"] == [] and result["Nodes"] is None
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}


@pytest.mark.parametrize("items", [[], None], ids=["empty-items", "null-items"])
@pytest.mark.parametrize("the_pod", [GPU_POD, CPU_POD], ids=["gpu-pod", "cpu-pod"])
def test_filter_of_an_empty_node_list_answers_an_empty_node_list(
    extender: Extender, the_pod: dict[str, Any], items: list[Any] | None
) -> None:
    result = extender.filter({"Pod": the_pod, "NodeNames": None, "Nodes": {"metadata": {}, "items": items}})

    assert result["Nodes"] == {"metadata": {}, "items": []} and result["NodeNames"] is None
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}


@pytest.mark.parametrize(
    "args",
    [{"NodeNames": []}, {"NodeNames": None, "Nodes": {"metadata": {}, "items": None}}, {"Nodes": {"items": []}}],
    ids=["no-names", "null-items", "empty-items"],
)
def test_prioritize_of_no_candidate_answers_an_empty_list(extender: Extender, args: dict[str, Any]) -> None:
    assert extender.prioritize({"Pod": GPU_POD, **args}) == []


def test_null_node_names_beside_a_node_list_reads_the_node_list(extender: Extender) -> None:
    # What kube-scheduler sends without nodeCacheCapable: NodeNames null, the Nodes in a NodeList.
    result = extender.filter({"Pod": GPU_POD, "NodeNames": None, "Nodes": node_list("n1", "n2")})

    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["n1", "n2"]


def test_a_filter_of_some_nodes_answers_only_those(extender: Extender) -> None:
    result = extender.filter({"Pod": share_pod("big", core=100, memory="40Gi"), "NodeNames": ["n2"]})

    assert result["NodeNames"] == [] and list(result["FailedAndUnresolvableNodes"]) == ["n2"]


@pytest.mark.parametrize(
    ("nodes", "field"),
    [([], "ExtenderArgs.Nodes"), ("n1", "ExtenderArgs.Nodes"), ({"items": "n1"}, "ExtenderArgs.Nodes.items")],
)
def test_a_node_list_of_another_shape_is_refused_naming_the_field(extender: Extender, nodes: Any, field: str) -> None:
    with pytest.raises(InvalidRequest, match=rf"^{field}: expected"):
        extender.filter({"Pod": GPU_POD, "Nodes": nodes})


def test_the_service_filters_no_node_for_an_empty_list_and_every_node_for_none(embedded_service: Build) -> None:
    service = embedded_service()
    service.report_devices(gpu_node("n1", gpus=1))
    service.report_devices(gpu_node("n2", gpus=1))

    assert service.filter(GPU_POD, []).verdicts == ()
    assert sorted(v.node_name for v in service.filter(GPU_POD, None).verdicts) == ["n1", "n2"]


def _bound_core(service: SchedulingService, namespace: str, name: str) -> list[int]:
    bound = service.get_pod(namespace=namespace, name=name)  # the embedded state's copy of a bound pod
    assert bound is not None, f"{namespace}/{name} is not bound"
    allocation = decode_allocation(bound["metadata"]["annotations"][names.DEVICE_ALLOCATED])
    return [g.core_percent for g in allocation.gpus]


def test_bind_binds_the_pod_it_names_among_pods_filtered_with_one_uid(
    extender: Extender, service: SchedulingService
) -> None:
    small = share_pod("small", core=10, memory="1Gi", uid="same-uid")
    big = share_pod("big", core=100, memory="40Gi", uid="same-uid")
    extender.filter({"Pod": small, "NodeNames": ["n1"]})
    extender.filter({"Pod": big, "NodeNames": ["n1"]})

    result = extender.bind({"PodName": "small", "PodNamespace": "default", "PodUID": "same-uid", "Node": "n1"})

    assert result == {"Error": ""}
    assert _bound_core(service, "default", "small") == [10]
    assert service.get_pod(namespace="default", name="big") is None


@pytest.mark.parametrize(
    ("namespace", "name", "uid"),
    [("other", "p", "uid-p"), ("default", "q", "uid-p"), ("default", "p", "uid-q")],
    ids=["other-namespace", "other-name", "other-uid"],
)
def test_bind_of_a_pod_filter_never_carried_is_refused_not_swapped(
    extender: Extender, service: SchedulingService, namespace: str, name: str, uid: str
) -> None:
    extender.filter({"Pod": share_pod("p", core=10, memory="1Gi", uid="uid-p"), "NodeNames": ["n1"]})

    result = extender.bind({"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": "n1"})

    assert f"pod {namespace}/{name} not found" in result["Error"]
    assert service.get_pod(namespace=namespace, name=name) is None
    assert service.get_pod(namespace="default", name="p") is None
