"""Properties over many generated requests: the arithmetic, the rules, and robustness to garbage."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from apis import names
from apis.request import DeviceRequest, RequestError, parse_pod
from apis.translation import TranslationRules
from tests.apis_request.podspecs import container, limits_pod, pod

MI = 2**20
CORE, MEM, RATIO, SHARED = names.GPU_CORE, names.GPU_MEMORY, names.GPU_MEMORY_RATIO, names.GPU_SHARED
percent = st.integers(min_value=1, max_value=100)
cards = st.integers(min_value=1, max_value=16)


@given(gpus=cards, core=percent, ratio=percent)
def test_gpu_shared_splits_core_and_ratio_evenly_over_the_cards(gpus: int, core: int, ratio: int) -> None:
    request = parse_pod(limits_pod({CORE: core * gpus, RATIO: ratio * gpus, SHARED: gpus}))
    assert request == DeviceRequest(
        gpus=gpus, core_percent=core, memory_bytes=None, memory_ratio_percent=ratio,
        whole=core == 100 and ratio == 100, source="koordinator",
    )


@given(gpus=cards, mib=st.integers(min_value=1, max_value=200_000))
def test_whole_card_core_splits_memory_bytes_over_the_cards(gpus: int, mib: int) -> None:
    request = parse_pod(limits_pod({CORE: 100 * gpus, MEM: f"{mib * gpus}Mi"}))
    assert request is not None
    assert (request.gpus, request.core_percent, request.memory_bytes) == (gpus, 100, mib * MI)


@given(value=st.integers(min_value=101, max_value=10_000).filter(lambda v: v % 100 != 0))
def test_any_percentage_above_100_that_is_not_whole_cards_is_rejected(value: int) -> None:
    try:
        parse_pod(limits_pod({CORE: value, RATIO: value}))
    except RequestError as exc:
        assert all(f"={value}:" in e and "multiple of 100" in e for e in exc.errors)
    else:
        raise AssertionError(f"{value} was accepted")


@given(gpus=cards, core=st.integers(min_value=0, max_value=100), mib=st.integers(min_value=1, max_value=100_000))
def test_hami_means_the_same_as_koordinator_gpu_shared(gpus: int, core: int, mib: int) -> None:
    hami: dict[str, object] = {"nvidia.com/gpu": gpus, "nvidia.com/gpumem": mib}
    koord: dict[str, object] = {SHARED: gpus, MEM: f"{mib * gpus}Mi"}
    if core:
        hami["nvidia.com/gpucores"] = core
        koord[CORE] = core * gpus
    from_hami, from_koord = parse_pod(limits_pod(hami)), parse_pod(limits_pod(koord))
    assert from_hami is not None and from_koord is not None
    assert from_hami.to_json() | {"source": "koordinator"} == from_koord.to_json()


requests = st.builds(
    lambda gpus, core, use_ratio, amount, source: DeviceRequest(
        gpus=gpus, core_percent=core,
        memory_bytes=None if use_ratio else amount,
        memory_ratio_percent=min(amount, 100) if use_ratio else None,
        whole=False, source=source,
    ),
    cards, st.integers(min_value=0, max_value=100), st.booleans(), st.integers(min_value=1, max_value=2**40), st.text(max_size=10),
)


@given(requests)
def test_device_request_json_round_trips(request: DeviceRequest) -> None:
    assert DeviceRequest.from_json(json.loads(json.dumps(request.to_json()))) == request


resource_names = st.sampled_from(sorted({*names.KOORDINATOR_RESOURCES, *TranslationRules.default().resources, "cpu", "memory"}))
garbage = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20), st.floats(), st.text(max_size=12),
    st.sampled_from(["50", "1e999999999", "10Gi", "0.5", "-1", "1e3", "Mi", ".5", "100m", "nan", "inf"]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
resource_maps = st.dictionaries(resource_names, garbage, max_size=5)


@given(st.lists(st.tuples(resource_maps, resource_maps), min_size=1, max_size=3), resource_maps)
def test_any_resource_values_give_a_request_none_or_a_request_error(
    containers: list[tuple[dict[str, Any], dict[str, Any]]], init: dict[str, Any]
) -> None:
    manifest = pod(*(container(f"c{i}", limits=lim, requests=req) for i, (lim, req) in enumerate(containers)),
                   init=[container("init", limits=init)])
    try:
        result = parse_pod(manifest)
    except RequestError as exc:
        assert exc.errors and all(isinstance(e, str) and e for e in exc.errors)
    else:
        assert result is None or isinstance(result, DeviceRequest)
