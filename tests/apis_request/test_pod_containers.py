"""How a pod's containers combine: Kubernetes' effective-request rule, and both pod shapes."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from apis import names
from apis.pods import pod_key
from apis.request import DeviceRequest, RequestError, parse_pod, pod_cpu_memory
from tests.apis_request.podspecs import container, pod

CORE, RATIO, MEM = names.GPU_CORE, names.GPU_MEMORY_RATIO, names.GPU_MEMORY
GI = 2**30


def ratio_share(gpus: int, percent: int) -> DeviceRequest:
    whole = percent == 100
    return DeviceRequest(gpus=gpus, core_percent=percent, memory_bytes=None, memory_ratio_percent=percent, whole=whole,
                         source="koordinator")


def koord(percent: int) -> dict[str, object]:
    return {CORE: percent, RATIO: percent}


EFFECTIVE = [
    pytest.param(pod(container("a", limits=koord(30)), container("b", limits=koord(20))), ratio_share(1, 50),
                 id="app-containers-add-up"),
    pytest.param(pod(container("a", limits=koord(60)), container("b", limits=koord(40))), ratio_share(1, 100),
                 id="app-containers-adding-to-a-whole-gpu"),
    pytest.param(pod(container(limits=koord(50)), init=[container("init", limits=koord(25))]), ratio_share(1, 50),
                 id="smaller-init-container-is-covered-by-the-app"),
    pytest.param(pod(container(limits=koord(25)), init=[container("init", limits=koord(75))]), ratio_share(1, 75),
                 id="larger-init-container-sets-the-pod-request"),
    pytest.param(pod(container(limits={"cpu": 1}), init=[container("init", limits=koord(40))]), ratio_share(1, 40),
                 id="gpu-only-in-an-init-container"),
    pytest.param(
        pod(container(limits=koord(30)), init=[container("sidecar", limits=koord(20), restart_policy="Always")]),
        ratio_share(1, 50), id="sidecar-adds-to-the-app",
    ),
    pytest.param(
        pod(container(limits=koord(10)),
            init=[container("sidecar", limits=koord(20), restart_policy="Always"), container("init", limits=koord(70))]),
        ratio_share(1, 90), id="init-after-a-sidecar-runs-beside-it",
    ),
    pytest.param(pod(container("a", limits={names.NVIDIA_GPU: 1}), container("b", limits={names.NVIDIA_GPU: 2})),
                 DeviceRequest(gpus=3, core_percent=100, memory_bytes=None, memory_ratio_percent=100, whole=True, source="nvidia"),
                 id="whole-gpus-of-containers-add-up"),
]


@pytest.mark.parametrize(("manifest", "expected"), EFFECTIVE)
def test_containers_combine_by_kubernetes_effective_request_rule(manifest: dict[str, Any], expected: DeviceRequest) -> None:
    assert parse_pod(manifest) == expected


def test_a_sum_that_breaks_a_rule_names_the_containers_together() -> None:
    bad = pod(container("a", limits=koord(60)), container("b", limits=koord(60)))
    with pytest.raises(RequestError) as caught:
        parse_pod(bad)
    core_message, ratio_message = caught.value.errors
    assert core_message.startswith('containers "a", "b" together: ')
    assert f"{CORE}=120 (sum)" in core_message and "multiple of 100" in core_message
    assert f"{RATIO}=120 (sum)" in ratio_message


def test_containers_asking_in_different_products_resources_are_rejected() -> None:
    bad = pod(container("a", limits={names.NVIDIA_GPU: 1, "nvidia.com/gpumem": 100}), container("b", limits=koord(10)))
    with pytest.raises(RequestError) as caught:
        parse_pod(bad)
    (message,) = caught.value.errors
    assert 'container "a" asks as hami (nvidia.com/gpu=1)' in message
    assert f'container "b" asks as koordinator ({CORE}=10)' in message


def test_an_init_container_error_says_it_is_an_init_container() -> None:
    with pytest.raises(RequestError, match=r'^init container "prep": koordinator.sh/gpu-core=50: .*core alone'):
        parse_pod(pod(container(), init=[container("prep", limits={CORE: 50})]))


def v1pod(limits: dict[str, str]) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="model", namespace="serving"),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="server", image="busybox:1.36",
                    resources=client.V1ResourceRequirements(limits=limits, requests={"cpu": "250m", "memory": "1Gi"}),
                )
            ],
            init_containers=[
                client.V1Container(name="fetch", image="busybox:1.36",
                                   resources=client.V1ResourceRequirements(requests={"cpu": "2", "memory": "512Mi"}))
            ],
        ),
    )


def test_a_kubernetes_client_v1pod_reads_like_its_dict() -> None:
    model = v1pod({CORE: "50", MEM: "10Gi"})
    as_dict = client.ApiClient().sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
    assert parse_pod(model) == parse_pod(as_dict) == DeviceRequest(
        gpus=1, core_percent=50, memory_bytes=10 * GI, memory_ratio_percent=None, whole=False, source="koordinator"
    )
    assert pod_cpu_memory(model) == pod_cpu_memory(as_dict) == (2000, GI)
    assert pod_key(model) == "serving/model"


CPU_MEMORY = [
    pytest.param(pod(container(requests={"cpu": "500m", "memory": "1Gi"})), (500, GI), id="one-container"),
    pytest.param(pod(container("a", requests={"cpu": "1"}), container("b", requests={"cpu": "250m", "memory": "1Mi"})),
                 (1250, 2**20), id="app-containers-add-up"),
    pytest.param(pod(container(limits={"cpu": "2", "memory": "2Gi"})), (2000, 2 * GI), id="limits-only-count-as-requests"),
    pytest.param(pod(container(requests={"cpu": "1"}), init=[container("i", requests={"cpu": "3"})]), (3000, 0),
                 id="larger-init-container-wins"),
    pytest.param(
        pod(container(requests={"cpu": "1"}),
            init=[container("s", requests={"cpu": "500m"}, restart_policy="Always"), container("i", requests={"cpu": "1"})]),
        (1500, 0), id="sidecar-adds-to-app-and-to-later-inits",
    ),
    pytest.param(pod(container(requests={"cpu": "1", "memory": "1Gi"}), overhead={"cpu": "100m", "memory": "64Mi"}),
                 (1100, GI + 64 * 2**20), id="runtime-class-overhead-is-added"),
    pytest.param(pod(container(requests={"cpu": "1m", "memory": "1500m"})), (1, 2), id="fractions-round-up"),
    pytest.param(pod(container()), (0, 0), id="no-requests"),
]


@pytest.mark.parametrize(("manifest", "expected"), CPU_MEMORY)
def test_pod_cpu_and_memory_follow_kubernetes_rules(manifest: dict[str, Any], expected: tuple[int, int]) -> None:
    assert pod_cpu_memory(manifest) == expected


def test_bad_cpu_or_memory_quantities_name_the_container() -> None:
    with pytest.raises(RequestError) as caught:
        pod_cpu_memory(pod(container("web", requests={"cpu": "lots", "memory": "-1Gi"})))
    assert caught.value.errors == [
        'container "web": cpu=lots: is not a quantity; write e.g. 500m or 2 for cpu, 512Mi or 4Gi for memory',
        'container "web": memory=-1Gi: is negative; ask for zero or more',
    ]


MISSHAPEN = [
    pytest.param({"spec": {"containers": 5}}, "spec.containers: expected a list of containers, got int", id="containers-not-a-list"),
    pytest.param({"spec": {"containers": ["main"]}}, "spec.containers[0]: expected a container", id="container-not-a-mapping"),
    pytest.param({"spec": {"containers": [{"name": "m", "resources": {"limits": ["a"]}}]}},
                 "spec.containers[0].resources.limits: expected a mapping, got list", id="limits-not-a-mapping"),
    pytest.param({"spec": {"initContainers": [{"name": "i", "resources": "lots"}], "containers": []}},
                 "spec.initContainers[0].resources: expected a mapping, got str", id="resources-not-a-mapping"),
]


@pytest.mark.parametrize(("manifest", "fragment"), MISSHAPEN)
def test_a_misshapen_pod_is_a_request_error_naming_the_field(manifest: dict[str, Any], fragment: str) -> None:
    for parse in (parse_pod, pod_cpu_memory):
        with pytest.raises(RequestError) as caught:
            parse(manifest)
        assert fragment in caught.value.errors[0]
