"""The built-in translation rules: other products' resources and what they normalize to."""

from __future__ import annotations

import pytest

from apis.request import DeviceRequest, RequestError, parse_pod
from apis.translation import TranslationRules
from tests.apis_request.podspecs import limits_pod

MI, GI = 2**20, 2**30


def req(source: str, gpus: int, core: int, *, memory: int | None = None, ratio: int | None = None) -> DeviceRequest:
    whole = core == 100 and ratio == 100
    return DeviceRequest(gpus=gpus, core_percent=core, memory_bytes=memory, memory_ratio_percent=ratio, whole=whole, source=source)


TRANSLATIONS = [
    # NVIDIA device plugin
    pytest.param({"nvidia.com/gpu": 1}, req("nvidia", 1, 100, ratio=100), id="nvidia-gpu-1-is-one-whole-gpu"),
    pytest.param({"nvidia.com/gpu": "2"}, req("nvidia", 2, 100, ratio=100), id="nvidia-gpu-2-is-two-whole-gpus"),
    # HAMi: count, per-card percent, per-card MiB, per-card memory percent
    pytest.param({"nvidia.com/gpu": 2, "nvidia.com/gpucores": 30, "nvidia.com/gpumem": 4000},
                 req("hami", 2, 30, memory=4000 * MI), id="hami-cores-and-mib-apply-to-each-card"),
    pytest.param({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}, req("hami", 1, 0, memory=3000 * MI),
                 id="hami-memory-without-cores-is-memory-only"),
    pytest.param({"nvidia.com/gpumem": 1024}, req("hami", 1, 0, memory=GI), id="hami-count-defaults-to-one"),
    pytest.param({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50}, req("hami", 1, 50, ratio=100),
                 id="hami-cores-without-memory-takes-the-whole-memory"),
    pytest.param({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25, "nvidia.com/gpucores": 25},
                 req("hami", 1, 25, ratio=25), id="hami-memory-percentage-is-a-ratio"),
    pytest.param({"nvidia.com/gpu": 2, "nvidia.com/gpucores": 100}, req("hami", 2, 100, ratio=100),
                 id="hami-full-cores-with-default-memory-is-whole"),
    # Volcano vGPU
    pytest.param({"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 50, "volcano.sh/vgpu-memory": 2048},
                 req("volcano", 1, 50, memory=2048 * MI), id="volcano-cores-and-mib-per-card"),
    pytest.param({"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 1000},
                 req("volcano", 2, 0, memory=1000 * MI), id="volcano-memory-only-over-two-cards"),
    pytest.param({"volcano.sh/vgpu-number": 3}, req("volcano", 3, 100, ratio=100), id="volcano-number-alone-is-whole-gpus"),
    # Aliyun: GiB on one card
    pytest.param({"aliyun.com/gpu-mem": 8}, req("aliyun", 1, 0, memory=8 * GI), id="aliyun-gpu-mem-is-gib-on-one-card"),
    # Tencent qGPU: percent total (100 per card), GiB total
    pytest.param({"tke.cloud.tencent.com/qgpu-core": 40, "tke.cloud.tencent.com/qgpu-memory": 5},
                 req("qgpu", 1, 40, memory=5 * GI), id="qgpu-share-of-one-card"),
    pytest.param({"tke.cloud.tencent.com/qgpu-core": 200, "tke.cloud.tencent.com/qgpu-memory": 40},
                 req("qgpu", 2, 100, memory=20 * GI), id="qgpu-core-200-is-two-cards-memory-split"),
    pytest.param({"tke.cloud.tencent.com/qgpu-memory": 4}, req("qgpu", 1, 0, memory=4 * GI), id="qgpu-memory-only"),
]


@pytest.mark.parametrize(("limits", "expected"), TRANSLATIONS)
def test_built_in_rules_translate_vendor_resources(limits: dict[str, object], expected: DeviceRequest) -> None:
    assert parse_pod(limits_pod(limits)) == expected


INVALID = [
    pytest.param({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150, "nvidia.com/gpumem": 100},
                 ["nvidia.com/gpucores=150", "cannot exceed 100", "more GPUs come from nvidia.com/gpu"], id="hami-cores-over-100"),
    pytest.param({"nvidia.com/gpumem": "4Gi"}, ["nvidia.com/gpumem=4Gi", "counted in Mi", "e.g. 4096"], id="hami-suffixed-mib"),
    pytest.param({"nvidia.com/gpu": -1}, ["nvidia.com/gpu=-1", "is negative"], id="nvidia-negative"),
    pytest.param({"nvidia.com/gpu": "1.5"}, ["nvidia.com/gpu=1.5", "fractional"], id="nvidia-fractional"),
    pytest.param({"aliyun.com/gpu-mem": "x"}, ["aliyun.com/gpu-mem=x", "not a number"], id="aliyun-non-numeric"),
    pytest.param({"tke.cloud.tencent.com/qgpu-core": 150, "tke.cloud.tencent.com/qgpu-memory": 4},
                 ["tke.cloud.tencent.com/qgpu-core=150", "multiple of 100"], id="qgpu-core-150"),
    pytest.param({"tke.cloud.tencent.com/qgpu-core": 50}, ["qgpu-core=50", "core alone", "add tke.cloud.tencent.com/qgpu-memory"],
                 id="qgpu-core-alone"),
    pytest.param({"volcano.sh/vgpu-cores": 50}, ["vgpu-cores=50", "core alone", "volcano.sh/vgpu-memory"], id="volcano-core-alone"),
    pytest.param({"aliyun.com/gpu-mem": 8, "nvidia.com/gpumem": 100}, ["aliyun.com/gpu-mem=8", "not part of the hami rule"],
                 id="two-vendors-in-one-container"),
]


@pytest.mark.parametrize(("limits", "fragments"), INVALID)
def test_invalid_vendor_requests_name_the_vendor_resource(limits: dict[str, object], fragments: list[str]) -> None:
    with pytest.raises(RequestError) as caught:
        parse_pod(limits_pod(limits))
    message = caught.value.errors[0]
    assert message.startswith('container "main": ')
    for fragment in fragments:
        assert fragment in message


ZEROS = [
    # Koordinator reads nvidia.com/gpu itself and drops zeros (utils.go, GetPodDeviceRequests: quotav1.RemoveZeros).
    pytest.param({"nvidia.com/gpu": 0}, None, id="nvidia-zero-asks-for-no-gpu"),
    pytest.param({"nvidia.com/gpu": 0, "nvidia.com/gpumem": 0}, None, id="all-zero-vendor-resources-ask-for-no-gpu"),
    # A zero vendor amount counts as not written too, so the rule's default applies.
    pytest.param({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 0, "nvidia.com/gpumem": 1000}, req("hami", 1, 0, memory=1000 * MI),
                 id="hami-zero-cores-is-the-default-none"),
    pytest.param({"nvidia.com/gpu": 0, "nvidia.com/gpumem": 1000}, req("hami", 1, 0, memory=1000 * MI),
                 id="hami-zero-count-is-the-default-one-card"),
]


@pytest.mark.parametrize(("limits", "expected"), ZEROS)
def test_a_zero_vendor_resource_counts_as_not_written(limits: dict[str, object], expected: DeviceRequest | None) -> None:
    assert parse_pod(limits_pod(limits)) == expected


def test_the_built_in_rules_cover_every_product_the_issue_names() -> None:
    assert [r.name for r in TranslationRules.default().rules] == ["hami", "nvidia", "volcano", "aliyun", "qgpu"]


def test_the_built_in_rules_are_loaded_once() -> None:
    assert TranslationRules.default() is TranslationRules.default()


def test_a_vendor_added_by_rules_is_read_with_no_code_change() -> None:
    rules = TranslationRules.from_yaml(
        """
version: 1
rules:
  - name: acme
    count: {resource: acme.example/vgpu, default: 1}
    core: {resource: acme.example/vgpu-compute, per: gpu, default: 0}
    memory: {resource: acme.example/vgpu-vram, unit: Gi, per: gpu}
"""
    )
    pod = limits_pod({"acme.example/vgpu": 2, "acme.example/vgpu-compute": 40, "acme.example/vgpu-vram": 6})
    assert parse_pod(pod, rules=rules) == req("acme", 2, 40, memory=6 * GI)
    # The default rules are not in effect with custom ones: nvidia.com/gpu is just another resource.
    assert parse_pod(limits_pod({"nvidia.com/gpu": 1}), rules=rules) is None
