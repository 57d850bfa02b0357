"""Refusals at admission: memory counts in canonical form, requests without limits, and fixes that hold.

Each case here came from review (tests/review/test_heldout_admission_review.py
holds them end to end, over the webhook and `fgpuctl validate`); these pin the
rules in `apis.translation_rule`, `apis.pod_check` and `apis.request_checks`.
"""

from __future__ import annotations

import re

import pytest

from apis import names
from apis.pod_check import check_pod
from apis.request import DeviceRequest, RequestError, parse_pod
from apis.translation import TranslationRules
from tests.apis_request.podspecs import container, limits_pod, pod

MI = 2**20
RULES = TranslationRules.default()


def _errors(limits: dict[str, object]) -> list[str]:
    with pytest.raises(RequestError) as caught:
        parse_pod(limits_pod(limits))
    return list(caught.value.errors)


# --- memory counted in a unit, as the API server re-emits it ---------------------------------


@pytest.mark.parametrize(("written", "mib"), [
    ("4k", 4000),  # 4000 in canonical form
    ("1M", 10**6),
    ("4e3", 4000),
    ("4000", 4000),
    ("4000000m", 4000),  # a whole number with a fractional suffix is still whole
    (4000, 4000),
])
def test_hami_memory_with_a_decimal_suffix_or_exponent_is_a_count_of_mib(written: object, mib: int) -> None:
    request = parse_pod(limits_pod({"nvidia.com/gpumem": written, "nvidia.com/gpucores": "30"}))
    assert request == DeviceRequest(gpus=1, core_percent=30, memory_bytes=mib * MI, memory_ratio_percent=None,
                                    whole=False, source="hami")


def test_volcano_memory_in_canonical_form_is_a_count_of_mib() -> None:
    request = parse_pod(limits_pod({"volcano.sh/vgpu-memory": "2k", "volcano.sh/vgpu-cores": "50"}))
    assert request is not None and request.memory_bytes == 2000 * MI and request.source == "volcano"


@pytest.mark.parametrize(("written", "example"), [
    ("4Gi", "4096"),
    ("1536Ki", "2"),  # 1.5 MiB: the whole count above it
    ("512Ki", "1"),
    ("1Mi", "1"),
])
def test_a_binary_suffix_on_a_count_of_mib_is_refused_with_a_count_that_holds_it(written: str, example: str) -> None:
    (message,) = _errors({"nvidia.com/gpumem": written})
    assert f"nvidia.com/gpumem={written}" in message and "counted in Mi" in message, message
    assert message.endswith(f"e.g. {example}"), message
    # The example given is itself accepted.
    assert parse_pod(limits_pod({"nvidia.com/gpumem": example})) is not None


def test_a_fractional_count_of_mib_is_refused() -> None:
    (message,) = _errors({"nvidia.com/gpumem": "1500m"})  # 1.5 MiB
    assert "nvidia.com/gpumem=1500m" in message and "is fractional" in message, message


# --- requests without limits ---------------------------------------------------------------


def test_a_gpu_resource_in_requests_only_is_refused_naming_container_resource_and_value() -> None:
    check = check_pod(pod(container("train", requests={names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"})),
                      rules=RULES)
    assert not check.valid
    assert len(check.errors) == 2, check.errors
    for resource, message in zip((names.GPU_CORE, names.GPU_MEMORY_RATIO), check.errors, strict=True):
        assert message.startswith(f'container "train": {resource}=50 (requests): '), message
        assert "put it in limits" in message and "default to the limits" in message, message


def test_requests_only_is_refused_for_vendor_resources_and_init_containers_too() -> None:
    check = check_pod(pod(container("main", limits={"cpu": "1"}),
                          init=[container("warmup", requests={"nvidia.com/gpu": "1"})]), rules=RULES)
    assert check.errors == (
        'init container "warmup": nvidia.com/gpu=1 (requests): is in requests without limits, which Kubernetes '
        "refuses for an extended resource; put it in limits: 1 (requests may be left out: they default to the limits)",
    )


def test_requests_beside_equal_limits_and_cpu_in_requests_only_are_accepted() -> None:
    both = pod(container(requests={names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50", "cpu": "1"},
                         limits={names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}))
    assert check_pod(both, rules=RULES).valid


# --- each problem once, and fixes that are not refused themselves --------------------------


def test_koordinator_gpu_above_100_is_refused_once() -> None:
    messages = _errors({names.KOORD_GPU: "150"})
    assert messages == [m for i, m in enumerate(messages) if m not in messages[:i]]
    assert len(messages) == 1 and f"{names.KOORD_GPU}=150: is above 100" in messages[0], messages


@pytest.mark.parametrize(("limits", "valid_core"), [
    ({names.GPU_CORE: "150"}, 100),
    ({names.GPU_CORE: "250"}, 200),
    ({names.GPU_CORE: "300"}, 300),
    ({names.GPU_CORE: "50"}, 50),
    ({names.GPU_CORE: "150", names.GPU_SHARED: "2"}, 150),
    ({names.GPU_CORE: "300", names.GPU_SHARED: "2"}, 200),
    ({names.GPU_CORE: "75", names.GPU_SHARED: "2"}, 74),
])
def test_core_alone_lists_every_problem_and_suggests_a_ratio_that_is_valid(
    limits: dict[str, object], valid_core: int
) -> None:
    messages = _errors(limits)
    assert "core alone is invalid" in messages[-1], messages
    suggested = re.search(rf"add {re.escape(names.GPU_MEMORY_RATIO)} \(e\.g\. (\d+)\)", messages[-1])
    assert suggested is not None, messages
    ratio = suggested.group(1)
    # The value's own problems come first, and are listed beside "core alone".
    core_ok = str(valid_core) == limits[names.GPU_CORE]
    assert len(messages) == (1 if core_ok else 2), messages
    # With the suggested ratio, the ratio is never what is refused; with a valid core too, the pod is accepted.
    with_ratio = {**limits, names.GPU_MEMORY_RATIO: ratio}
    try:
        parse_pod(limits_pod(with_ratio))
    except RequestError as exc:
        assert not core_ok, exc.errors
        assert all(f"{names.GPU_MEMORY_RATIO}=" not in m for m in exc.errors), exc.errors
    assert parse_pod(limits_pod({**with_ratio, names.GPU_CORE: str(valid_core)})) is not None
