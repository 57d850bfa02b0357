"""Pods written in Koordinator's resources: what they normalize to, and every validation rule."""

from __future__ import annotations

import pytest

from apis import names
from apis.request import DeviceRequest, RequestError, parse_pod
from tests.apis_request.podspecs import container, limits_pod, pod

GI = 2**30
CORE, MEM, RATIO, SHARED = names.GPU_CORE, names.GPU_MEMORY, names.GPU_MEMORY_RATIO, names.GPU_SHARED


def share(gpus: int, core: int, *, memory: int | None = None, ratio: int | None = None, whole: bool = False) -> DeviceRequest:
    return DeviceRequest(
        gpus=gpus, core_percent=core, memory_bytes=memory, memory_ratio_percent=ratio, whole=whole, source="koordinator"
    )


VALID = [
    pytest.param({CORE: 200, RATIO: 200}, share(2, 100, ratio=100, whole=True), id="core-200-ratio-200-is-two-whole-gpus"),
    pytest.param({CORE: "50", MEM: "10Gi"}, share(1, 50, memory=10 * GI), id="core-50-memory-10Gi-is-a-share-of-one"),
    pytest.param({CORE: 100, RATIO: 100, SHARED: 2}, share(2, 50, ratio=50), id="shared-2-halves-core-and-ratio-per-card"),
    pytest.param({CORE: 200, RATIO: 200, SHARED: 2}, share(2, 100, ratio=100, whole=True), id="shared-2-at-100-each-is-whole"),
    pytest.param({CORE: 60, MEM: "20Gi", SHARED: 2}, share(2, 30, memory=10 * GI), id="shared-2-splits-memory-bytes"),
    pytest.param({names.KOORD_GPU: 200}, share(2, 100, ratio=100, whole=True), id="koord-gpu-200-is-two-whole-gpus"),
    pytest.param({names.KOORD_GPU: 50}, share(1, 50, ratio=50), id="koord-gpu-50-is-half-a-gpu-compute-and-memory"),
    pytest.param({RATIO: 30}, share(1, 0, ratio=30), id="ratio-alone-is-memory-only"),
    pytest.param({MEM: "8Gi"}, share(1, 0, memory=8 * GI), id="memory-alone-is-memory-only"),
    pytest.param({RATIO: 200}, share(2, 0, ratio=100), id="ratio-200-alone-is-memory-of-two-cards"),
    pytest.param({CORE: 100, RATIO: 100}, share(1, 100, ratio=100, whole=True), id="core-100-ratio-100-is-one-whole-gpu"),
    pytest.param({CORE: 100, MEM: "40Gi"}, share(1, 100, memory=40 * GI), id="full-core-with-bytes-is-not-whole"),
    pytest.param({CORE: 300, MEM: "30Gi"}, share(3, 100, memory=10 * GI), id="core-300-splits-bytes-over-three"),
    # Koordinator divides and rounds down (devicehandler_gpu.go, calcDesiredRequestsAndCountForGPU).
    pytest.param({CORE: 300, MEM: "10Gi"}, share(3, 100, memory=10 * GI // 3), id="memory-not-splitting-over-cards-rounds-down"),
    # Koordinator drops zero quantities (utils.go, GetPodDeviceRequests: quotav1.RemoveZeros).
    pytest.param({CORE: 0, RATIO: 50}, share(1, 0, ratio=50), id="zero-counts-as-not-written"),
    pytest.param({CORE: 100, RATIO: 50}, share(1, 100, ratio=50), id="full-core-half-memory"),
    pytest.param({CORE: 1, RATIO: 1}, share(1, 1, ratio=1), id="smallest-share"),
    pytest.param({CORE: "1e2", RATIO: "100"}, share(1, 100, ratio=100, whole=True), id="exponent-notation-is-a-quantity"),
]


@pytest.mark.parametrize(("limits", "expected"), VALID)
def test_koordinator_resources_normalize_to_the_expected_request(limits: dict[str, object], expected: DeviceRequest) -> None:
    assert parse_pod(limits_pod(limits)) == expected


# Each row: limits, then fragments every message must contain (container, resource, value, fix).
INVALID = [
    pytest.param({CORE: 150, RATIO: 100}, [CORE, "=150", "multiple of 100", "ask for 100 or 200"], id="percent-150-rejected"),
    pytest.param({CORE: 100, RATIO: 250}, [RATIO, "=250", "multiple of 100", "200 or 300"], id="ratio-250-rejected"),
    pytest.param({CORE: 50}, [CORE, "=50", "core alone is invalid", f"add {RATIO}"], id="core-alone-rejected"),
    pytest.param({CORE: 50, MEM: "10Gi", RATIO: 50}, [MEM, "=10Gi", f"{RATIO}=50", "together are invalid", "keep only one"],
                 id="memory-and-ratio-together-rejected"),
    pytest.param({CORE: 75, RATIO: 100, SHARED: 2}, [CORE, "=75", f"multiple of {SHARED}=2", "74 or 76"],
                 id="shared-core-not-a-multiple-rejected"),
    pytest.param({CORE: 100, RATIO: 75, SHARED: 2}, [RATIO, "=75", "multiple of"], id="shared-ratio-not-a-multiple-rejected"),
    pytest.param({CORE: 300, RATIO: 200, SHARED: 2}, [CORE, "=300", "more than 100 per card", "at most 200"],
                 id="shared-over-100-per-card-rejected"),
    pytest.param({SHARED: 2}, [SHARED, "=2", "no share is asked"], id="shared-without-share-rejected"),
    # Koordinator counts cards from the ratio (calcDesiredRequestsAndCountForGPU): 200% of one card, never placed.
    pytest.param({CORE: 200, RATIO: 50}, [CORE, "=200", "more than 100 per card", f"{RATIO}=50 spans 1 card(s)", "at most 100"],
                 id="core-over-the-ratio-cards-rejected"),
    pytest.param({names.KOORD_GPU: 150}, [names.KOORD_GPU, "=150", "multiple of 100"], id="koord-gpu-150-rejected"),
    pytest.param({names.KOORD_GPU: 100, CORE: 50, RATIO: 50}, [names.KOORD_GPU, "=100", "cannot be combined with", CORE],
                 id="whole-gpus-combined-with-share-rejected"),
    pytest.param({CORE: "-50", RATIO: 50}, [CORE, "=-50", "is negative", "or for 0"], id="negative-rejected"),
    pytest.param({CORE: "0.5", RATIO: 50}, [CORE, "=0.5", "fractional", "whole number"], id="fractional-rejected"),
    pytest.param({CORE: "500m", RATIO: 50}, [CORE, "=500m", "fractional"], id="milli-fraction-rejected"),
    pytest.param({CORE: "half", RATIO: 50}, [CORE, "=half", "not a number", "whole number such as 50"], id="non-numeric-rejected"),
    pytest.param({CORE: True, RATIO: 50}, [CORE, "=True", "not a number"], id="boolean-rejected"),
    pytest.param({MEM: "1500m"}, [MEM, "=1500m", "fractional", "20Gi"], id="fractional-bytes-rejected"),
    pytest.param({names.NVIDIA_GPU: 1, CORE: 50, RATIO: 50}, [names.NVIDIA_GPU, "=1", f"{CORE}=50", "mixed with koordinator"],
                 id="vendor-mixed-with-koordinator-rejected"),
]


@pytest.mark.parametrize(("limits", "fragments"), INVALID)
def test_invalid_koordinator_requests_are_rejected_with_a_message_naming_what_to_fix(
    limits: dict[str, object], fragments: list[str]
) -> None:
    with pytest.raises(RequestError) as caught:
        parse_pod(limits_pod(limits))
    message = caught.value.errors[0]
    assert message.startswith('container "main": ')
    for fragment in fragments:
        assert fragment in message


def test_every_problem_of_a_container_is_reported_not_only_the_first() -> None:
    with pytest.raises(RequestError) as caught:
        parse_pod(limits_pod({CORE: "abc", RATIO: "-1"}))
    assert len(caught.value.errors) == 2
    assert CORE in caught.value.errors[0] and RATIO in caught.value.errors[1]


def test_a_pod_without_gpu_resources_asks_for_no_gpu() -> None:
    assert parse_pod(limits_pod({"cpu": "2", "memory": "4Gi", "example.com/rdma": 1})) is None


def test_limits_must_equal_requests_when_both_are_given() -> None:
    bad = pod(container(requests={CORE: 50, RATIO: 50}, limits={CORE: 100, RATIO: 50}))
    with pytest.raises(RequestError) as caught:
        parse_pod(bad)
    (message,) = caught.value.errors
    assert CORE in message and "50 (requests) vs 100 (limits)" in message and "limits must equal requests" in message


def test_equal_requests_and_limits_are_accepted_in_different_spellings() -> None:
    good = pod(container(requests={MEM: "1Gi", CORE: "50"}, limits={MEM: "1073741824", CORE: 50}))
    assert parse_pod(good) == share(1, 50, memory=GI)


def test_requests_alone_are_read_like_limits_alone() -> None:
    assert parse_pod(pod(container(requests={CORE: 50, RATIO: 50}))) == parse_pod(limits_pod({CORE: 50, RATIO: 50}))


def test_a_container_with_compute_but_no_memory_of_its_own_is_rejected_though_the_sum_is_valid() -> None:
    # Koordinator checks only the sum (utils.go, GetPodDeviceRequests), which is valid here; fgpu
    # limits each container to its own part, so "b" would get no GPU memory (docs/translation-rules.md).
    bad = pod(container("a", limits={CORE: 50, MEM: "1Gi"}), container("b", limits={CORE: 50}))
    with pytest.raises(RequestError) as caught:
        parse_pod(bad)
    (message,) = caught.value.errors
    assert message.startswith(f'container "b": {CORE}=50: ') and "no GPU memory of its own" in message
