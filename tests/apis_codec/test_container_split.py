"""Splitting a pod's GPU shares among the containers that asked for them."""

from __future__ import annotations

import pytest

from apis import names
from apis.allocation import (
    Allocation,
    AllocationError,
    ContainerShare,
    GPUShare,
    decode_allocation,
    encode_allocation,
)
from apis.container_split import SplitError, split_allocation
from apis.pods import ContainerKind
from apis.request import ContainerRequest, DeviceRequest, container_requests

GiB = 2**30
TOTAL = 80 * GiB
MEMORY = {f"GPU-{i}": TOTAL for i in range(4)}


def _share(i: int, core: int, ratio: int) -> GPUShare:
    return GPUShare(minor=i, uuid=f"GPU-{i}", core_percent=core, memory_bytes=TOTAL * ratio // 100, memory_ratio_percent=ratio)


def _req(name: str, core: int, ratio: int, *, gpus: int = 1, kind: ContainerKind = ContainerKind.APP) -> ContainerRequest:
    whole = core == 100 and ratio == 100
    return ContainerRequest(name, kind, DeviceRequest(
        gpus=gpus, core_percent=core, memory_bytes=None, memory_ratio_percent=ratio, whole=whole, source="koordinator"
    ))


def _parts(allocation: Allocation) -> dict[str, list[tuple[int, int, int]]]:
    out: dict[str, list[tuple[int, int, int]]] = {}
    for i, share in enumerate(allocation.gpus):
        for c in share.containers:
            out.setdefault(c.name, []).append((i, c.core_percent, c.memory_ratio_percent))
    return out


def test_two_containers_on_one_card_each_get_their_own_part_and_the_parts_add_up() -> None:
    split = split_allocation(Allocation(gpus=(_share(0, 50, 50),)), [_req("a", 30, 30), _req("b", 20, 20)], gpu_memory=MEMORY)
    assert _parts(split) == {"a": [(0, 30, 30)], "b": [(0, 20, 20)]}
    (share,) = split.gpus
    assert sum(c.core_percent for c in share.containers) == share.core_percent
    assert sum(c.memory_bytes for c in share.containers) <= share.memory_bytes


def test_containers_asking_for_whole_cards_get_different_cards() -> None:
    allocation = Allocation(gpus=(_share(0, 100, 100), _share(1, 100, 100), _share(2, 100, 100)))
    split = split_allocation(allocation, [_req("one", 100, 100), _req("two", 100, 100, gpus=2)], gpu_memory=MEMORY)
    parts = _parts(split)
    assert sorted(i for i, _, _ in parts["one"] + parts["two"]) == [0, 1, 2]
    assert len(parts["two"]) == 2


def test_a_plain_init_container_runs_alone_so_it_may_reuse_what_the_apps_get() -> None:
    containers = [_req("init", 100, 100, kind=ContainerKind.INIT), _req("app", 50, 50)]
    split = split_allocation(Allocation(gpus=(_share(0, 100, 100),)), containers, gpu_memory=MEMORY)
    assert _parts(split) == {"init": [(0, 100, 100)], "app": [(0, 50, 50)]}


def test_an_init_container_shares_the_card_with_the_sidecars_started_before_it() -> None:
    containers = [
        _req("sidecar", 40, 40, kind=ContainerKind.SIDECAR),
        _req("init", 70, 60, kind=ContainerKind.INIT),
        _req("app", 60, 60),
    ]
    with pytest.raises(SplitError, match="'init'"):
        split_allocation(Allocation(gpus=(_share(0, 100, 100),)), containers, gpu_memory=MEMORY)
    containers[1] = _req("init", 60, 60, kind=ContainerKind.INIT)
    split = split_allocation(Allocation(gpus=(_share(0, 100, 100),)), containers, gpu_memory=MEMORY)
    assert _parts(split)["init"] == [(0, 60, 60)]


def test_requests_that_do_not_fit_the_shares_name_the_container() -> None:
    with pytest.raises(SplitError, match="container 'b' asks for 1 GPU"):
        split_allocation(Allocation(gpus=(_share(0, 50, 50),)), [_req("a", 30, 30), _req("b", 30, 30)], gpu_memory=MEMORY)


def test_container_requests_come_from_the_pod_spec_and_skip_containers_without_gpus() -> None:
    pod = {"spec": {
        "initContainers": [{"name": "setup", "resources": {}}],
        "containers": [
            {"name": "log", "resources": {"limits": {"cpu": "1"}}},
            {"name": "main", "resources": {"limits": {names.GPU_CORE: "30", names.GPU_MEMORY_RATIO: "30"}}},
        ],
    }}
    (only,) = container_requests(pod)
    assert (only.name, only.kind, only.request.core_percent) == ("main", ContainerKind.APP, 30)


def test_the_split_survives_the_annotation_codec_and_koordinator_readers_see_plain_entries() -> None:
    split = split_allocation(Allocation(gpus=(_share(0, 50, 50),)), [_req("a", 30, 30), _req("b", 20, 20)], gpu_memory=MEMORY)
    text = encode_allocation(split)
    assert decode_allocation(text) == split
    assert f'"{names.ALLOCATION_CONTAINERS}":{{"a":' in text
    assert not decode_allocation(encode_allocation(Allocation(gpus=(_share(0, 50, 50),)))).names_containers


@pytest.mark.parametrize(
    "extension, problem",
    [
        ({names.ALLOCATION_CONTAINERS: ["a"]}, "must be an object of container name"),
        ({names.ALLOCATION_CONTAINERS: {"a": 5}}, r"\[a\] must be an object"),
        ({names.ALLOCATION_CONTAINERS: {"a": {names.GPU_CORE: "150"}}}, "above 100"),
    ],
)
def test_a_malformed_container_list_is_refused_with_the_field(extension: object, problem: str) -> None:
    import json

    text = json.dumps({"gpu": [{"minor": 0, "resources": {names.GPU_CORE: "50"}, "extension": extension}]})
    with pytest.raises(AllocationError, match=problem):
        decode_allocation(text)


def test_encoding_refuses_a_container_part_larger_than_the_share() -> None:
    share = GPUShare(0, "GPU-0", 50, GiB, 50, containers=(ContainerShare("a", 60, GiB, 50),))
    with pytest.raises(AllocationError, match="container 'a'"):
        encode_allocation(Allocation(gpus=(share,)))


def test_a_memory_only_container_beside_compute_is_refused_since_it_would_run_without_a_compute_cap() -> None:
    with pytest.raises(SplitError, match="'b' asks for GPU memory only"):
        split_allocation(Allocation(gpus=(_share(0, 50, 70),)), [_req("a", 50, 50), _req("b", 0, 20)], gpu_memory=MEMORY)


def test_memory_only_containers_on_a_memory_only_share_are_split() -> None:
    split = split_allocation(Allocation(gpus=(_share(0, 0, 50),)), [_req("a", 0, 30), _req("b", 0, 20)], gpu_memory=MEMORY)
    assert _parts(split) == {"a": [(0, 0, 30)], "b": [(0, 0, 20)]}
