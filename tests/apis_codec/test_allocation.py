"""The device-allocated annotation: exact when written, tolerant when read."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis import names
from apis.allocation import (
    Allocation,
    AllocationError,
    ContainerShare,
    GPUShare,
    decode_allocation,
    encode_allocation,
    share_memory_bytes,
)
from tests.apis_codec.strategies import allocations

HALF_A100 = GPUShare(
    minor=0, uuid="GPU-8f2b0c3e", core_percent=50, memory_bytes=20 * 2**30, memory_ratio_percent=50
)


def test_writes_the_koordinator_shape_with_sorted_keys_and_no_spaces() -> None:
    text = encode_allocation(Allocation(gpus=(HALF_A100,)))

    assert text == (
        '{"gpu":[{"id":"GPU-8f2b0c3e","minor":0,"resources":{'
        '"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"20Gi",'
        '"koordinator.sh/gpu-memory-ratio":"50"}}]}'
    )


def test_writes_memory_in_its_shortest_exact_binary_form() -> None:
    shares = (
        GPUShare(minor=1, uuid="a", core_percent=0, memory_bytes=1536 * 2**20, memory_ratio_percent=10),
        GPUShare(minor=2, uuid="b", core_percent=0, memory_bytes=1000, memory_ratio_percent=10),
    )

    data = json.loads(encode_allocation(Allocation(gpus=shares)))

    assert [e["resources"][names.GPU_MEMORY] for e in data["gpu"]] == ["1536Mi", "1000"]


def test_keeps_the_order_of_gpus_because_it_is_the_containers_device_order() -> None:
    shares = tuple(
        GPUShare(minor=m, uuid=f"GPU-{m}", core_percent=100, memory_bytes=2**30, memory_ratio_percent=100)
        for m in (3, 1, 2)
    )

    data = json.loads(encode_allocation(Allocation(gpus=shares)))

    assert [e["minor"] for e in data["gpu"]] == [3, 1, 2]


def test_writes_a_mig_uuid_where_koordinator_readers_skip_it_and_reads_it_back() -> None:
    share = GPUShare(
        minor=0, uuid="GPU-1", core_percent=100, memory_bytes=10 * 2**30, memory_ratio_percent=100, mig_uuid="MIG-4f2c"
    )

    text = encode_allocation(Allocation(gpus=(share,)))
    entry = json.loads(text)["gpu"][0]

    assert set(entry) == {"id", "minor", "resources", "extension"}
    assert entry["extension"] == {names.ALLOCATION_MIG_UUID: "MIG-4f2c"}
    assert decode_allocation(text).gpus[0].mig_uuid == "MIG-4f2c"


def test_leaves_out_id_when_the_uuid_is_unknown() -> None:
    share = GPUShare(minor=4, uuid="", core_percent=100, memory_bytes=0, memory_ratio_percent=100)

    entry = json.loads(encode_allocation(Allocation(gpus=(share,))))["gpu"][0]

    assert "id" not in entry


@pytest.mark.parametrize(
    ("share", "fragment"),
    [
        (GPUShare(minor=-1, uuid="x", core_percent=50, memory_bytes=0, memory_ratio_percent=50), "minor=-1"),
        (GPUShare(minor=0, uuid="x", core_percent=150, memory_bytes=0, memory_ratio_percent=50), "core_percent=150"),
        (GPUShare(minor=0, uuid="x", core_percent=-5, memory_bytes=0, memory_ratio_percent=50), "core_percent=-5"),
        (GPUShare(minor=0, uuid="x", core_percent=50, memory_bytes=0, memory_ratio_percent=101), "memory_ratio_percent=101"),
        (GPUShare(minor=0, uuid="x", core_percent=50, memory_bytes=-1, memory_ratio_percent=50), "memory_bytes=-1"),
    ],
)
def test_refuses_to_write_a_share_no_reader_could_use(share: GPUShare, fragment: str) -> None:
    with pytest.raises(AllocationError, match="gpus\\[0\\]") as err:
        encode_allocation(Allocation(gpus=(share,)))

    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '{"gpu":[{"minor":0,"id":"GPU-8f2b0c3e","resources":{"koordinator.sh/gpu-core":"50",'
            '"koordinator.sh/gpu-memory":"20Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}',
            (HALF_A100,),
            id="fgpu-written",
        ),
        pytest.param(
            '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":100,'
            '"koordinator.sh/gpu-memory-ratio":100,"koordinator.sh/gpu-memory":"16Gi"}},'
            '{"minor":1,"resources":{"koordinator.sh/gpu-core":100,'
            '"koordinator.sh/gpu-memory-ratio":100,"koordinator.sh/gpu-memory":"16Gi"}}],'
            '"rdma":[{"minor":0,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":100}}]}',
            (
                GPUShare(minor=0, uuid="", core_percent=100, memory_bytes=16 * 2**30, memory_ratio_percent=100),
                GPUShare(minor=1, uuid="", core_percent=100, memory_bytes=16 * 2**30, memory_ratio_percent=100),
            ),
            id="koordinator-numbers-no-id-with-rdma",
        ),
        pytest.param(
            '{ "gpu": [ { "minor": 2, "id": "GPU-2", "futureField": {"a": 1},'
            ' "extension": {"gpuSharedResourceTemplate": "t1", "vfs": [{"minor": 1}]},'
            ' "resources": {"koordinator.sh/gpu-core": "30", "koordinator.sh/gpu-memory": 8589934592,'
            ' "koordinator.sh/gpu-memory-ratio": "25", "koordinator.sh/other": "7"} } ] }',
            (GPUShare(minor=2, uuid="GPU-2", core_percent=30, memory_bytes=8 * 2**30, memory_ratio_percent=25),),
            id="extra-keys-and-koordinator-extension",
        ),
        pytest.param(
            '{"gpu":[{"minor":3,"id":null,"resources":{"koordinator.sh/gpu-memory":"8G"}}]}',
            (GPUShare(minor=3, uuid="", core_percent=0, memory_bytes=8 * 10**9, memory_ratio_percent=0),),
            id="missing-resources-read-as-zero",
        ),
        pytest.param('{"gpu":[{"minor":1,"resources":null}]}', (GPUShare(1, "", 0, 0, 0),), id="null-resources"),
        pytest.param('{"rdma":[{"minor":0,"resources":{}}]}', (), id="no-gpu-entries"),
        pytest.param('{"gpu":null}', (), id="null-gpu-list"),
        pytest.param("{}", (), id="empty-object"),
    ],
)
def test_reads_what_fgpu_or_koordinator_wrote(text: str, expected: tuple[GPUShare, ...]) -> None:
    assert decode_allocation(text) == Allocation(gpus=expected)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("", "not valid JSON", id="empty"),
        pytest.param('{"gpu":[', "not valid JSON", id="truncated"),
        pytest.param("[" * 100_000 + "]" * 100_000, "not valid JSON", id="nested-beyond-the-recursion-limit"),
        pytest.param('{"gpu": NaN}', '"gpu" must be a list of device entries, got the number nan', id="nan-list"),
        pytest.param(
            '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":NaN}}]}',
            "resources[koordinator.sh/gpu-core]=nan is not a finite quantity",
            id="nan-core",
        ),
        pytest.param(
            '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":-Infinity}}]}',
            "resources[koordinator.sh/gpu-memory]=-inf is not a finite quantity",
            id="infinite-memory",
        ),
        pytest.param('[{"minor":0}]', "JSON object keyed by device type, got a list", id="top-level-list"),
        pytest.param('"gpu"', "got the string 'gpu'", id="top-level-string"),
        pytest.param('{"gpu":{"minor":0}}', '"gpu" must be a list', id="gpu-not-a-list"),
        pytest.param('{"gpu":[7]}', "gpu[0] must be an object, got the number 7", id="entry-not-object"),
        pytest.param('{"gpu":[{"resources":{}}]}', "gpu[0].minor=None", id="minor-missing"),
        pytest.param('{"gpu":[{"minor":-1}]}', "gpu[0].minor=-1", id="minor-negative"),
        pytest.param('{"gpu":[{"minor":"0"}]}', "gpu[0].minor='0'", id="minor-string"),
        pytest.param('{"gpu":[{"minor":true}]}', "gpu[0].minor=True", id="minor-bool"),
        pytest.param('{"gpu":[{"minor":0,"id":5}]}', "gpu[0].id=5", id="id-number"),
        pytest.param('{"gpu":[{"minor":0,"resources":[1]}]}', "gpu[0].resources must be an object", id="resources-list"),
        pytest.param(
            '{"gpu":[{"minor":0},{"minor":1,"resources":{"koordinator.sh/gpu-core":"lots"}}]}',
            "gpu[1].resources[koordinator.sh/gpu-core]: 'lots' is not a quantity",
            id="core-not-a-quantity",
        ),
        pytest.param(
            '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"150"}}]}',
            "resources[koordinator.sh/gpu-core]='150' is above 100",
            id="core-above-one-gpu",
        ),
        pytest.param(
            '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory-ratio":101}}]}',
            "resources[koordinator.sh/gpu-memory-ratio]=101 is above 100",
            id="ratio-above-one-gpu",
        ),
        pytest.param(
            '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"1.5"}}]}',
            "resources[koordinator.sh/gpu-memory]='1.5' must be a whole number",
            id="memory-fractional",
        ),
        pytest.param(
            '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-memory":"-1Gi"}}]}',
            "resources[koordinator.sh/gpu-memory]='-1Gi' must be a whole number >= 0",
            id="memory-negative",
        ),
        pytest.param(
            '{"gpu":[{"minor":0,"extension":{"fgpu.io/mig-uuid":3}}]}',
            "extension[fgpu.io/mig-uuid]=3 must be a string",
            id="mig-uuid-number",
        ),
    ],
)
def test_says_which_entry_field_and_value_cannot_be_read(text: str, fragment: str) -> None:
    with pytest.raises(AllocationError) as err:
        decode_allocation(text)

    message = str(err.value)
    assert message.startswith(names.DEVICE_ALLOCATED)
    assert fragment in message


def test_lists_uuids_in_order_preferring_the_mig_instance() -> None:
    allocation = Allocation(
        gpus=(
            GPUShare(minor=1, uuid="GPU-1", core_percent=100, memory_bytes=0, memory_ratio_percent=100, mig_uuid="MIG-a"),
            GPUShare(minor=0, uuid="GPU-0", core_percent=100, memory_bytes=0, memory_ratio_percent=100),
        )
    )

    assert allocation.uuids == ("MIG-a", "GPU-0")


@given(allocations)
def test_any_valid_allocation_survives_encode_then_decode(allocation: Allocation) -> None:
    assert decode_allocation(encode_allocation(allocation)) == allocation


@given(allocations)
def test_encoding_is_canonical_so_reencoding_a_decoded_value_gives_the_same_bytes(allocation: Allocation) -> None:
    text = encode_allocation(allocation)

    assert encode_allocation(decode_allocation(text)) == text
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)
entry_like = st.fixed_dictionaries(
    {},
    optional={
        "minor": json_values,
        "id": json_values,
        "resources": st.dictionaries(
            st.sampled_from([names.GPU_CORE, names.GPU_MEMORY, names.GPU_MEMORY_RATIO, "x"]), json_values
        )
        | json_values,
        "extension": st.dictionaries(st.sampled_from([names.ALLOCATION_MIG_UUID, "vfs"]), json_values) | json_values,
    },
)


@given(
    st.text()
    | st.dictionaries(st.sampled_from(["gpu", "rdma"]), st.lists(entry_like) | json_values).map(json.dumps)
)
def test_any_input_decodes_or_fails_with_an_allocation_error_never_anything_else(text: str) -> None:
    try:
        allocation = decode_allocation(text)
    except AllocationError as err:
        assert str(err).startswith(names.DEVICE_ALLOCATED)
    else:
        assert decode_allocation(encode_allocation(allocation)) == allocation


# --- the memory a share gets on a GPU -------------------------------------------------------

GiB = 2**30


@pytest.mark.parametrize(
    ("core", "memory", "ratio", "expected"),
    [
        pytest.param(50, 20 * GiB, 25, 20 * GiB, id="bytes-win-over-the-ratio"),
        pytest.param(50, 0, 25, 20 * GiB, id="ratio-only-is-that-part-of-this-gpu"),
        pytest.param(100, 0, 100, 80 * GiB, id="whole-gpu-by-ratio"),
        pytest.param(100, 0, 0, 80 * GiB, id="whole-gpu-with-neither-bytes-nor-ratio-gets-all-its-memory"),
        pytest.param(50, 0, 0, 0, id="part-of-the-compute-with-neither-gets-none"),
        pytest.param(0, 512, 0, 512, id="memory-only"),
    ],
)
def test_the_memory_a_share_gets_is_its_bytes_else_its_ratio_else_all_for_a_whole_gpu(
    core: int, memory: int, ratio: int, expected: int
) -> None:
    share = GPUShare(minor=0, uuid="GPU-0", core_percent=core, memory_bytes=memory, memory_ratio_percent=ratio)
    part = ContainerShare(name="main", core_percent=core, memory_bytes=memory, memory_ratio_percent=ratio)

    assert share_memory_bytes(share, gpu_memory_bytes=80 * GiB) == expected
    assert share_memory_bytes(part, gpu_memory_bytes=80 * GiB) == expected
