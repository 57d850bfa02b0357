"""The scheduler's MIG choice against hand-worked cases on A100 80GB geometry (8 memory slices, 7 compute)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from apis.allocation import Allocation, GPUShare
from apis.inventory import GPUInfo, MIGInstance
from apis.mig import A100_80GB, MIGPlacement, Occupied, free_placements
from scheduler_plugin.core import mig_placement
from scheduler_plugin.core.mig_placement import GPUSlot, MIGChoice

GiB = 2**30
PROFILES = {p.name: p for p in A100_80GB}


def instance(profile: str, start: int, *, uuid: str = "", fgpu: bool = False) -> MIGInstance:
    p = PROFILES[profile]
    return MIGInstance(
        uuid=uuid or f"MIG-{profile}-{start}", profile=profile, memory_bytes=p.memory_bytes, slices=p.slices,
        profile_id=p.profile_id, placement_start=start, placement_size=p.placements[0].size, fgpu_created=fgpu,
    )


def gpu(index: int, *instances: MIGInstance) -> GPUInfo:
    return GPUInfo(
        uuid=f"GPU-{index}", minor=index, index=index, model="NVIDIA A100-SXM4-80GB", model_label="A100-SXM4-80GB",
        memory_bytes=80 * GiB, mig_enabled=True, mig_instances=instances, mig_profiles=A100_80GB,
    )


def view(g: GPUInfo, *, held: frozenset[str] = frozenset(), allocations: tuple[Allocation, ...] = ()) -> GPUSlot:
    return GPUSlot(g.index, g, held, mig_placement.promised_on(g, allocations))


def choose(*views: GPUSlot, need_gib: float) -> MIGChoice | None:
    return mig_placement.choose(views, [int(need_gib * GiB)] * len(views))


def taken(*instances: MIGInstance) -> tuple[Occupied, ...]:
    out = mig_placement.occupied(view(gpu(0, *instances)))
    assert out is not None
    return out


def test_a_3g_at_start_4_leaves_the_4g_and_another_3g_at_start_0() -> None:
    assert free_placements(PROFILES["4g.40gb"], taken(instance("3g.40gb", 4))) == (MIGPlacement(0, 4),)
    assert free_placements(PROFILES["3g.40gb"], taken(instance("3g.40gb", 4))) == (MIGPlacement(0, 4),)


def test_a_3g_at_start_0_blocks_the_4g_and_leaves_a_3g_at_start_4() -> None:
    assert free_placements(PROFILES["4g.40gb"], taken(instance("3g.40gb", 0))) == ()
    got = choose(view(gpu(0, instance("3g.40gb", 0, uuid="MIG-op")), held=frozenset({"MIG-op"})), need_gib=30)
    assert got == MIGChoice(0, "3g.40gb", PROFILES["3g.40gb"].memory_bytes, 4)


@pytest.mark.parametrize(
    ("need_gib", "expected"),
    [
        # the smallest profile that holds the memory, at the placement that keeps the most for larger ones
        # start 4 holds memory slice 7, which no 1g can use: four 1g placements stay (0..3), not three
        (30, MIGChoice(0, "3g.40gb", PROFILES["3g.40gb"].memory_bytes, 4)),
        # 1 slice beats 2g.20gb's 2; at 6 it breaks one 3g and one 1g placement, at 0 one 3g and two 1g
        (15, MIGChoice(0, "1g.20gb", PROFILES["1g.20gb"].memory_bytes, 6)),
        # every 1g.10gb breaks one 3g.40gb and one 1g.20gb placement, wherever it goes, so the lowest start.
        # (Start 6 used to win by keeping the 4g.40gb and 2g.20gb placements, but a memory request never
        # gets those: 3g.40gb and 1g.20gb hold as much with fewer slices. tests/review has the layout it stranded.)
        (5, MIGChoice(0, "1g.10gb", PROFILES["1g.10gb"].memory_bytes, 0)),
        (79, MIGChoice(0, "7g.80gb", PROFILES["7g.80gb"].memory_bytes, 0)),
    ],
)
def test_on_an_empty_gpu(need_gib: float, expected: MIGChoice) -> None:
    assert choose(view(gpu(0)), need_gib=need_gib) == expected


def test_nothing_fits_a_request_larger_than_every_profile() -> None:
    assert choose(view(gpu(0)), need_gib=81) is None


def test_a_carved_gpu_is_used_before_an_empty_one_is_broken() -> None:
    empty, carved = gpu(0), gpu(1, instance("3g.40gb", 4, uuid="MIG-a"))

    got = choose(view(empty, held=frozenset({"MIG-a"})), view(carved, held=frozenset({"MIG-a"})), need_gib=30)

    assert got == MIGChoice(1, "3g.40gb", PROFILES["3g.40gb"].memory_bytes, 0)  # GPU 0 keeps its 7g


def test_an_existing_free_operator_instance_is_taken_before_creating_one() -> None:
    g = gpu(0, instance("2g.20gb", 0, uuid="MIG-small"), instance("3g.40gb", 4, uuid="MIG-big"))

    assert choose(view(g), need_gib=15) == MIGChoice(0, "2g.20gb", PROFILES["2g.20gb"].memory_bytes, -1, "MIG-small")
    assert choose(view(g, held=frozenset({"MIG-small"})), need_gib=15) == MIGChoice(
        0, "3g.40gb", PROFILES["3g.40gb"].memory_bytes, -1, "MIG-big"
    )


def test_a_free_instance_fgpu_created_is_reused_by_its_placement() -> None:
    g = gpu(0, instance("3g.40gb", 4, fgpu=True))

    assert choose(view(g), need_gib=30) == MIGChoice(0, "3g.40gb", PROFILES["3g.40gb"].memory_bytes, 4)


def test_a_promised_placement_is_neither_reused_nor_created_twice() -> None:
    g = gpu(0, instance("3g.40gb", 4, fgpu=True))
    promise = Allocation(gpus=(GPUShare(0, g.uuid, 0, 0, 0, mig_profile="3g.40gb", mig_placement=4),))

    got = choose(view(g, allocations=(promise,)), need_gib=30)

    assert got == MIGChoice(0, "3g.40gb", PROFILES["3g.40gb"].memory_bytes, 0)


def test_a_promised_instance_not_yet_created_still_takes_its_slices() -> None:
    g = gpu(0)
    promise = Allocation(gpus=(GPUShare(0, g.uuid, 0, 0, 0, mig_profile="4g.40gb", mig_placement=0),))

    got = choose(view(g, allocations=(promise,)), need_gib=30)

    assert got == MIGChoice(0, "3g.40gb", PROFILES["3g.40gb"].memory_bytes, 4)
    assert choose(view(g, allocations=(promise, Allocation(gpus=(replace(promise.gpus[0], mig_profile="3g.40gb", mig_placement=4),)))), need_gib=5) is None


def test_a_gpu_whose_instance_placements_are_unknown_gets_no_new_instance() -> None:
    g = gpu(0, replace(instance("1g.10gb", 0, uuid="MIG-old"), placement_start=-1, placement_size=0))

    assert choose(view(g, held=frozenset({"MIG-old"})), need_gib=5) is None
    assert mig_placement.largest_free_memory(view(g, held=frozenset({"MIG-old"}))) == 0


def test_largest_free_memory_counts_what_could_be_created() -> None:
    assert mig_placement.largest_free_memory(view(gpu(0))) == PROFILES["7g.80gb"].memory_bytes
    carved = gpu(0, instance("3g.40gb", 0, uuid="MIG-a"))
    assert mig_placement.largest_free_memory(view(carved, held=frozenset({"MIG-a"}))) == PROFILES["3g.40gb"].memory_bytes


def test_only_profiles_a_memory_request_can_get_keep_room() -> None:
    # 4g.40gb and 2g.20gb hold no more than 3g.40gb and 1g.20gb with more slices; +me only adds engines
    kept = mig_placement.created_profiles(A100_80GB)

    assert sorted(p.name for p in kept) == ["1g.10gb", "1g.20gb", "3g.40gb", "7g.80gb"]


def test_small_instances_pack_from_the_low_end_and_leave_the_3g_at_4() -> None:
    first = choose(view(gpu(0)), need_gib=5)
    assert first == MIGChoice(0, "1g.10gb", PROFILES["1g.10gb"].memory_bytes, 0)
    second = choose(view(gpu(0, instance("1g.10gb", 0, fgpu=True)), allocations=(_promise("1g.10gb", 0),)), need_gib=5)
    # start 1 breaks nothing start 0 has not broken already (3g@0, 1g.20gb@0)
    assert second == MIGChoice(0, "1g.10gb", PROFILES["1g.10gb"].memory_bytes, 1)


@pytest.mark.parametrize("fgpu", [False, True])
def test_a_gpu_instance_without_a_mig_device_is_never_handed_out_but_takes_its_slices(fgpu: bool) -> None:
    # reported with uuid "" (no compute instance: nothing a container could open)
    g = gpu(0, replace(instance("3g.40gb", 4, fgpu=fgpu), uuid=""))

    assert mig_placement.free_instances(view(g)) == []
    assert choose(view(g), need_gib=30) == MIGChoice(0, "3g.40gb", PROFILES["3g.40gb"].memory_bytes, 0)
    assert choose(view(g), need_gib=50) is None  # the 7g would overlap it
    assert mig_placement.largest_free_memory(view(g)) == PROFILES["3g.40gb"].memory_bytes


def _promise(profile: str, start: int) -> Allocation:
    return Allocation(gpus=(GPUShare(0, "GPU-0", 0, 0, 0, mig_profile=profile, mig_placement=start),))
