"""GPU choice inside a node: packing shares, connected sets for whole GPUs, partitions, MIG."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from apis.allocation import Allocation, GPUShare
from apis.devices import GPUInfo, NVLinkPeer, Topology
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import GiB, gpu, node, pod, share, whole

N1 = NodeName("n1")


def _minors(allocation: Allocation) -> list[int]:
    return [g.minor for g in allocation.gpus]


def _scheduler(
    gpus: list[GPUInfo] | None = None, *, count: int = 8, model: str = "A100-SXM4-80GB", **kwargs: object
) -> Scheduler:
    scheduler = Scheduler(**kwargs)  # type: ignore[arg-type]
    scheduler.upsert_node_devices(node("n1", count, model=model, gpus=gpus))
    return scheduler


def _hold(scheduler: Scheduler, name: str, *minors: int, core: int = 100, gib: int = 80) -> None:
    shares = tuple(GPUShare(m, f"GPU-n1-{m}", core, gib * GiB, 100 if core == 100 else 0) for m in minors)
    scheduler.add_pod(pod(name), N1, Allocation(gpus=shares))


@dataclass(frozen=True)
class ShareCase:
    name: str
    gpu_policy: str
    #: (minor, core percent used, GiB used) already held
    held: tuple[tuple[int, int, int], ...]
    expected: int


SHARE_CASES = [
    ShareCase(
        "binpack puts a share on the fullest GPU that fits",
        "binpack",
        ((0, 20, 10), (1, 60, 30), (2, 90, 5)),
        1,
    ),
    ShareCase("spread puts a share on the emptiest GPU", "spread", ((0, 20, 10), (1, 60, 30), (2, 10, 5)), 3),
    ShareCase("binpack breaks ties by the lowest GPU", "binpack", (), 0),
]


@pytest.mark.parametrize("case", SHARE_CASES, ids=[c.name for c in SHARE_CASES])
def test_share_gpu_choice_follows_the_gpu_policy(case: ShareCase) -> None:
    scheduler = _scheduler(count=4, gpu_policy=case.gpu_policy)
    for minor, core, gib in case.held:
        _hold(scheduler, f"h{minor}", minor, core=core, gib=gib)
    allocation = scheduler.reserve(pod("p", share(30, gib=20)), N1)
    assert _minors(allocation) == [case.expected]


def test_a_share_allocation_carries_uuid_core_and_bytes_of_the_ratio() -> None:
    scheduler = _scheduler([gpu("n1", 0, model="T4", memory_gib=16)])
    allocation = scheduler.reserve(pod("p", share(25, ratio=50)), N1)
    assert allocation.gpus == (GPUShare(0, "GPU-n1-0", 25, 8 * GiB, 50),)


def test_a_whole_gpu_allocation_takes_all_core_and_memory() -> None:
    scheduler = _scheduler(count=2)
    allocation = scheduler.reserve(pod("p", whole(1)), N1)
    assert allocation.gpus == (GPUShare(0, "GPU-n1-0", 100, 80 * GiB, 100),)


def test_shared_cards_land_on_distinct_gpus() -> None:
    scheduler = _scheduler(count=4)
    allocation = scheduler.reserve(pod("p", share(50, ratio=50, cards=3)), N1)
    assert len(set(_minors(allocation))) == 3


# --- whole GPUs and topology -------------------------------------------------------


def _nvlink_pairs(model: str = "V100-SXM2-32GB") -> list[GPUInfo]:
    """Eight GPUs linked in pairs (0-1, 2-3, ...), PCIe roots per four, NUMA per four."""
    return [
        gpu(
            "n1",
            i,
            model=model,
            nvlink_to=[i ^ 1],
            pcie_root=f"pci{i // 4}",
            numa=i // 4,
        )
        for i in range(8)
    ]


@dataclass(frozen=True)
class WholeCase:
    name: str
    gpus: list[GPUInfo]
    held: tuple[int, ...]
    cards: int
    expected: list[int]
    scope: str = ""


def _pcie_only() -> list[GPUInfo]:
    return [gpu("n1", i, model="L40S", memory_gib=48, pcie_root=f"pci{i % 2}", numa=0) for i in range(4)]


def _numa_only() -> list[GPUInfo]:
    return [gpu("n1", i, model="L40S", memory_gib=48, numa=i % 2) for i in range(4)]


WHOLE_CASES = [
    WholeCase("two cards go to an NVLink pair", _nvlink_pairs(), (0,), 2, [2, 3]),
    WholeCase(
        "a single card goes to a pair already broken, keeping free pairs whole", _nvlink_pairs(), (0,), 1, [1]
    ),
    WholeCase("without NVLink, cards share a PCIe root", _pcie_only(), (), 2, [0, 2]),
    WholeCase("without NVLink or PCIe roots, cards share a NUMA node", _numa_only(), (0,), 2, [1, 3]),
    WholeCase("a required PCIe scope is kept", _pcie_only(), (0,), 2, [1, 3], "pcie"),
    WholeCase(
        "when no group holds the pod, any free cards are used", _nvlink_pairs(), (0, 2, 4, 6), 3, [1, 3, 5]
    ),
]


@pytest.mark.parametrize("case", WHOLE_CASES, ids=[c.name for c in WHOLE_CASES])
def test_whole_gpus_go_to_the_best_connected_free_set(case: WholeCase) -> None:
    scheduler = _scheduler(case.gpus)
    for minor in case.held:
        _hold(scheduler, f"h{minor}", minor)
    allocation = scheduler.reserve(pod("p", whole(case.cards), scope=case.scope), N1)
    assert sorted(_minors(allocation)) == case.expected


@pytest.mark.parametrize("model", ["H100-80GB-HBM3", "A100-SXM4-80GB", "H800"])
def test_hgx_boards_without_a_matrix_fill_partitions_and_keep_large_ones_whole(model: str) -> None:
    scheduler = _scheduler(count=8, model=model)
    placed = [
        sorted(_minors(scheduler.reserve(pod(f"p{i}", whole(n)), N1))) for i, n in enumerate([1, 1, 2, 4])
    ]
    assert placed == [[0], [1], [2, 3], [4, 5, 6, 7]]


def test_a_two_card_pod_uses_the_partition_of_an_already_broken_half() -> None:
    scheduler = _scheduler(count=8, model="H100-SXM5-80GB")
    _hold(scheduler, "h", 4)
    assert sorted(_minors(scheduler.reserve(pod("p", whole(2)), N1))) == [6, 7]


def test_a_size_the_partition_table_lacks_fills_broken_partitions_first() -> None:
    scheduler = _scheduler(count=8, model="H100-SXM5-80GB")
    _hold(scheduler, "h", 5)
    assert sorted(_minors(scheduler.reserve(pod("p", whole(3)), N1))) == [4, 6, 7]


def test_pcie_boards_of_the_same_chip_get_no_partition_table() -> None:
    gpus = [gpu("n1", i, model="A100-PCIE-40GB", memory_gib=40, pcie_root=f"pci{i // 2}") for i in range(8)]
    scheduler = _scheduler(gpus)
    _hold(scheduler, "h", 0, gib=40)
    # With partitions this would be [2, 3]; by PCIe root the broken pair's sibling is left alone
    # and the fullest root that fits two is taken.
    assert sorted(_minors(scheduler.reserve(pod("p", whole(2)), N1))) == [2, 3]
    assert sorted(_minors(scheduler.reserve(pod("q", whole(1)), N1))) == [1]


# --- MIG -----------------------------------------------------------------------------


def _mig_node() -> list[GPUInfo]:
    return [
        gpu("n1", 0, mig=[("1g.10gb", 10), ("2g.20gb", 20), ("3g.40gb", 40)]),
    ]


def test_a_share_matching_a_mig_profile_gets_the_smallest_instance_that_holds_it() -> None:
    scheduler = _scheduler(_mig_node())
    allocation = scheduler.reserve(pod("p", share(20, gib=15)), N1)
    assert allocation.gpus == (GPUShare(0, "GPU-n1-0", 20, 20 * GiB, 25, "MIG-n1-0-1"),)


def test_a_used_mig_instance_is_not_given_twice() -> None:
    scheduler = _scheduler(_mig_node())
    first = scheduler.reserve(pod("p", share(10, gib=10)), N1)
    second = scheduler.reserve(pod("q", share(10, gib=10)), N1)
    assert first.gpus[0].mig_uuid == "MIG-n1-0-0"
    assert second.gpus[0].mig_uuid == "MIG-n1-0-1"
    [verdict] = scheduler.filter(pod("r", share(10, gib=30)), [N1])
    assert verdict.feasible
    scheduler.reserve(pod("r", share(10, gib=30)), N1)
    [verdict] = scheduler.filter(pod("s", share(10, gib=5)), [N1])
    assert not verdict.feasible


def test_whole_gpu_pods_never_take_a_gpu_in_mig_mode() -> None:
    scheduler = _scheduler(_mig_node())
    [verdict] = scheduler.filter(pod("p", whole(1)), [N1])
    assert not verdict.feasible
    assert "1 in MIG mode" in verdict.reason


# --- one model per pod, NVSwitch boards ---------------------------------------------------


def _mixed() -> list[GPUInfo]:
    return [
        gpu("n1", 0, model="A100-SXM4-80GB"),
        gpu("n1", 1, model="T4", memory_gib=16),
        gpu("n1", 2, model="T4", memory_gib=16),
        gpu("n1", 3, model="A100-SXM4-80GB"),
    ]


def test_a_multi_card_pod_gets_cards_of_one_model() -> None:
    scheduler = _scheduler(_mixed())
    allocation = scheduler.reserve(pod("p", whole(2)), N1)
    assert {g.uuid for g in allocation.gpus} in ({"GPU-n1-0", "GPU-n1-3"}, {"GPU-n1-1", "GPU-n1-2"})
    shared = scheduler.reserve(pod("q", share(10, gib=4, cards=2)), N1)
    models = {scheduler.node_views()[0].gpus[g.minor].device.model_label for g in shared.gpus}
    assert len(models) == 1


def test_a_multi_card_pod_does_not_fit_when_no_model_has_enough_cards() -> None:
    scheduler = _scheduler(_mixed())
    _hold(scheduler, "h0", 0)
    _hold(scheduler, "h1", 1, gib=16)
    [verdict] = scheduler.filter(pod("p", whole(2)), [N1])
    assert not verdict.feasible
    assert verdict.reason == (
        "no GPU model has 2 fully free GPUs (A100-SXM4-80GB: 1, T4: 1); all cards of a pod are of one model"
    )


def _hgx_with_switch_peers() -> list[GPUInfo]:
    """An HGX board as NVML reports it: every GPU linked only to the six NVSwitches (8-digit domains)."""
    switches = [NVLinkPeer(bus_id=f"00000000:{0xC0 + k:02X}:00.0", links=3) for k in range(6)]
    return [
        GPUInfo(
            uuid=f"GPU-n1-{i}",
            minor=i,
            index=i,
            model="NVIDIA H100 80GB HBM3",
            model_label="H100-80GB-HBM3",
            memory_bytes=80 * GiB,
            topology=Topology(
                numa_node=i // 4, bus_id=f"0000:{i + 1:02x}:00.0", nvlink_peers=tuple(switches)
            ),
        )
        for i in range(8)
    ]


def test_gpus_linked_through_nvswitches_form_one_nvlink_group() -> None:
    scheduler = _scheduler(_hgx_with_switch_peers())
    _hold(scheduler, "h", 0, 1, 4, 5)
    # Two free per NUMA node: an NVLink scope of 4 is still met through the switches.
    assert scheduler.filter(pod("p", whole(4), scope="nvlink"), [N1])[0].feasible
    assert not scheduler.filter(pod("p", whole(4), scope="numa"), [N1])[0].feasible


def test_a_gpu_linked_to_a_gpu_by_an_8_digit_bus_id_is_its_peer() -> None:
    gpus = [gpu("n1", i, model="V100-SXM2-32GB", memory_gib=32, numa=i) for i in range(4)]
    linked = [
        replace(
            g,
            topology=replace(
                g.topology, nvlink_peers=(NVLinkPeer(bus_id=f"00000000:{(g.index ^ 1):02X}:00.0"),)
            ),
        )
        for g in gpus
    ]
    scheduler = _scheduler(linked)
    _hold(scheduler, "h", 0)
    assert sorted(_minors(scheduler.reserve(pod("p", whole(2), scope="nvlink"), N1))) == [2, 3]


@pytest.mark.parametrize("scope", ["numa", "pcie"])
def test_a_multi_card_share_with_a_required_scope_stays_inside_one_group(scope: str) -> None:
    gpus = [gpu("n1", i, model="L40S", memory_gib=48, numa=i // 2, pcie_root=f"pci{i // 2}") for i in range(4)]
    scheduler = _scheduler(gpus)
    # Binpack alone would take the two fullest cards, 0 and 2, which sit in different groups.
    _hold(scheduler, "a", 0, core=60, gib=10)
    _hold(scheduler, "b", 2, core=50, gib=10)
    allocation = scheduler.reserve(pod("p", share(30, gib=5, cards=2), scope=scope), N1)
    assert sorted(_minors(allocation)) == [0, 1]


def test_a_multi_card_share_with_a_scope_takes_the_tightest_group_that_holds_it() -> None:
    gpus = [gpu("n1", i, model="L40S", memory_gib=48, numa=0 if i < 3 else 1) for i in range(5)]
    scheduler = _scheduler(gpus)
    allocation = scheduler.reserve(pod("p", share(30, gib=5, cards=2), scope="numa"), N1)
    assert sorted(_minors(allocation)) == [3, 4]
