"""Which requests MIG serves, the pod's choice, and the allocation that tells the node what to create."""

from __future__ import annotations

import json

import pytest

from apis import mig, names
from apis.allocation import Allocation, AllocationError, GPUShare, decode_allocation, encode_allocation
from apis.mig import MIGMode, MIGRequestError

GiB = 2**30


@pytest.mark.parametrize(
    ("need_gib", "first"),
    [(5, "1g.10gb"), (10, "1g.20gb"), (19, "1g.20gb"), (20, "3g.40gb"), (39, "3g.40gb"), (40, "7g.80gb"), (80, None)],
)
def test_the_smallest_profile_that_covers_the_memory_comes_first(need_gib: int, first: str | None) -> None:
    covering = mig.covering_profiles(mig.A100_80GB, need_gib * GiB)
    assert (covering[0].name if covering else None) == first


@pytest.mark.parametrize(
    ("value", "mode"), [("", MIGMode.ANY), ("mig", MIGMode.MIG), ("shared", MIGMode.SHARED)]
)
def test_the_annotation_names_the_mode(value: str, mode: MIGMode) -> None:
    assert mig.mig_mode({names.GPU_MODE: value} if value else {}) is mode


def test_an_unknown_mode_is_refused_naming_the_field_and_the_choices() -> None:
    with pytest.raises(MIGRequestError, match=r"fgpu.io/gpu-mode='MIG'.*'mig'.*'shared'"):
        mig.mig_mode({names.GPU_MODE: "MIG"})


@pytest.mark.parametrize(
    ("cards", "whole", "fragment"), [(1, True, "whole GPUs"), (2, False, "gpu.shared=2")]
)
def test_mig_serves_single_card_shares_only(cards: int, whole: bool, fragment: str) -> None:
    with pytest.raises(MIGRequestError, match=fragment):
        mig.check_mig_request(MIGMode.MIG, cards=cards, whole=whole)
    mig.check_mig_request(MIGMode.ANY, cards=cards, whole=whole)  # no choice, no complaint


def test_an_instance_to_create_round_trips_in_the_signed_annotation() -> None:
    share = GPUShare(0, "GPU-0", 0, 40 * GiB, 50, mig_profile="3g.40gb", mig_placement=4)
    text = encode_allocation(Allocation(gpus=(share,)))

    assert json.loads(text)["gpu"][0]["extension"] == {names.ALLOCATION_MIG_PROFILE: "3g.40gb", names.ALLOCATION_MIG_PLACEMENT: 4}
    assert decode_allocation(text).gpus[0] == share


@pytest.mark.parametrize(
    ("extension", "fragment"),
    [
        ({names.ALLOCATION_MIG_PROFILE: "3g.40gb"}, "placement"),
        ({names.ALLOCATION_MIG_PROFILE: "3g.40gb", names.ALLOCATION_MIG_PLACEMENT: -1}, "placement"),
        ({names.ALLOCATION_MIG_PROFILE: "", names.ALLOCATION_MIG_PLACEMENT: 0}, "profile name"),
        ({names.ALLOCATION_MIG_PROFILE: "3g.40gb", names.ALLOCATION_MIG_PLACEMENT: 4, names.ALLOCATION_MIG_UUID: "MIG-x"}, "both"),
    ],
)
def test_a_malformed_instance_to_create_is_refused(extension: dict[str, object], fragment: str) -> None:
    text = json.dumps({"gpu": [{"minor": 0, "id": "GPU-0", "resources": {}, "extension": extension}]})
    with pytest.raises(AllocationError, match=fragment):
        decode_allocation(text)


@pytest.mark.parametrize(
    ("model", "mib", "table"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, mig.H100_80GB),  # nvidia-smi's total for the SXM5 80 GB
        ("NVIDIA H100 PCIe", 81559, mig.H100_80GB),
        ("NVIDIA H100 NVL", 95830, ()),  # 94 GB: 1g.12gb .. 7g.94gb, read from the driver
        ("NVIDIA H100 96GB HBM3", 97871, ()),
        ("NVIDIA A100-SXM4-40GB", 40960, mig.A100_40GB),
        ("NVIDIA A100-SXM4-80GB", 81920, mig.A100_80GB),
        ("NVIDIA H200", 143771, ()),
    ],
)
def test_only_gpus_whose_table_is_here_get_one(model: str, mib: int, table: tuple[mig.MIGProfile, ...]) -> None:
    assert mig.profiles_for_model(model, mib * 2**20) == table
