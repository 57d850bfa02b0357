"""The node creates what allocations ask for, destroys only its own idle leftovers, and survives restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import ProcessSpec, parse_inventory
from agent.mig_manager import (
    Create,
    Instance,
    Owned,
    Refuse,
    Use,
    Want,
    for_allocation,
    owned_now,
    to_destroy,
)
from agent.mig_nvml import MIGError, MIGNode, OwnedFile, read_instances

GPU = "GPU-a100"


# --- pure decisions -----------------------------------------------------------------------

def inst(gi: int, profile: str, start: int, *, uuid: str = "MIG-x", busy: bool = False) -> Instance:
    return Instance(GPU, gi, profile, start, uuid=uuid, busy=busy)


@pytest.mark.parametrize(
    ("instances", "owned", "live", "expected"),
    [
        ([], set(), [], Create),
        ([inst(2, "3g.40gb", 4)], {Owned(GPU, 2, "3g.40gb", 4, "MIG-x")}, [], Use),  # fgpu's free instance, re-used
        ([inst(2, "3g.40gb", 4)], set(), [], Refuse),  # an operator's instance sits there
        ([inst(2, "4g.40gb", 4)], {Owned(GPU, 2, "4g.40gb", 4, "MIG-x")}, [], Refuse),  # another profile sits there
        ([], set(), [Want("other-pod", GPU, "2g.20gb", 4)], Refuse),  # another live pod holds the placement
        # another live pod holds fgpu's instance there by its MIG UUID
        ([inst(2, "3g.40gb", 4)], {Owned(GPU, 2, "3g.40gb", 4, "MIG-x")}, [Want("other-pod", GPU, uuid="MIG-x")], Refuse),
        # holds elsewhere do not count: another GPU's placement, another instance's UUID, the pod's own claim
        ([inst(2, "3g.40gb", 4)], {Owned(GPU, 2, "3g.40gb", 4, "MIG-x")}, [
            Want("other-pod", "GPU-other", "3g.40gb", 4), Want("other-pod", GPU, uuid="MIG-y"),
            Want("pod", GPU, "3g.40gb", 4),
        ], Use),
    ],
)
def test_what_an_allocation_needs_before_the_container_starts(
    instances: list[Instance], owned: set[Owned], live: list[Want], expected: type
) -> None:
    got = for_allocation(Want("pod", GPU, "3g.40gb", 4), instances, frozenset(owned), live)
    assert isinstance(got, expected)


def test_only_fgpus_idle_unheld_instances_are_destroyed() -> None:
    mine_free, mine_held, mine_busy = inst(1, "1g.10gb", 0), inst(2, "1g.10gb", 1), inst(3, "1g.10gb", 2, busy=True)
    operators = inst(4, "1g.10gb", 3)
    owned = frozenset(Owned.of(i) for i in (mine_free, mine_held, mine_busy))

    got = to_destroy([mine_free, mine_held, mine_busy, operators], owned, [Want("p", GPU, "1g.10gb", 1)])

    assert [d.instance for d in got] == [mine_free]


def test_a_hold_by_mig_uuid_keeps_fgpus_instance_and_scopes_by_uuid_too() -> None:
    held, free = inst(1, "3g.40gb", 4, uuid="MIG-held"), inst(2, "1g.10gb", 0, uuid="MIG-free")
    owned = frozenset({Owned.of(held), Owned.of(free)})
    by_uuid = Want("x", GPU, uuid="MIG-held")

    assert [d.instance for d in to_destroy([held, free], owned, [by_uuid])] == [free]
    # A stopped pod that held fgpu's instance by UUID: only that instance is looked at.
    assert [d.instance for d in to_destroy([held, free], owned, [], scope=[by_uuid])] == [held]


def test_a_record_entry_nvml_contradicts_is_not_trusted_and_an_allocation_alone_owns_nothing() -> None:
    reused_id = inst(2, "2g.20gb", 0)  # the record says GI 2 was a 3g at 4: someone else made this one
    # An operator's 1g where a stale allocation asks fgpu to create one: still the operator's.
    operators = inst(5, "1g.10gb", 6)
    recorded = inst(3, "3g.40gb", 4, uuid="MIG-ours")
    remade = inst(4, "1g.10gb", 0, uuid="MIG-operators")  # fgpu's GI 4 was destroyed and made again at the same place
    entries = [
        Owned(GPU, 2, "3g.40gb", 4, "MIG-x"), Owned(GPU, 3, "3g.40gb", 4, "MIG-ours"),
        Owned(GPU, 4, "1g.10gb", 0, "MIG-fgpus-gone"),
    ]

    owned = owned_now([reused_id, recorded, operators, remade], entries)

    assert owned == frozenset({Owned(GPU, 3, "3g.40gb", 4, "MIG-ours")})


# --- through the fake NVML ------------------------------------------------------------------

def node(operator_instances: list[dict[str, object]] | None = None) -> FakeNVML:
    nvml = FakeNVML(parse_inventory({"gpus": [{
        "uuid": GPU, "name": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "busId": "00000000:07:00.0",
        "mig": {"mode": "enabled", "instances": operator_instances or []},
    }]}))
    nvml.nvmlInit()
    return nvml


def test_create_use_and_destroy_leave_nothing_behind(tmp_path: Path) -> None:
    nvml = node()
    mig = MIGNode(nvml, OwnedFile(tmp_path / "mig.json"))
    want = Want("pod-a", GPU, "3g.40gb", 4)

    uuid = mig.prepare(want, live=[want])

    assert [(i.profile, i.placement_start, i.uuid) for i in read_instances(nvml, GPU)] == [("3g.40gb", 4, uuid)]
    assert mig.prepare(want, live=[want]) == uuid  # a second container of the pod gets the same instance
    assert mig.reconcile([GPU], live=[want]) == []  # the pod still lives
    assert [i.uuid for i in mig.reconcile([GPU], live=[])] == [uuid]
    assert read_instances(nvml, GPU) == []


def test_a_taken_placement_refuses_with_nvmls_reason(tmp_path: Path) -> None:
    nvml = node([{"uuid": "MIG-op", "profile": "4g.40gb", "gpuInstanceId": 1}])  # the operator's 4g sits at {0}:4
    mig = MIGNode(nvml, OwnedFile(tmp_path / "mig.json"))
    want = Want("pod-a", GPU, "3g.40gb", 0)

    with pytest.raises(MIGError, match=r"not a free place|not free"):
        mig.prepare(want, live=[want])


def test_after_a_restart_only_fgpus_unheld_idle_instances_go(tmp_path: Path) -> None:
    nvml = node([{"uuid": "MIG-op", "profile": "1g.10gb", "gpuInstanceId": 7}])
    record = tmp_path / "mig.json"
    before = MIGNode(nvml, OwnedFile(record))
    live, gone, busy = Want("live", GPU, "2g.20gb", 2), Want("gone", GPU, "2g.20gb", 4), Want("busy", GPU, "1g.10gb", 6)
    uuids = {w.pod_uid: before.prepare(w, live=[live, gone, busy]) for w in (live, gone, busy)}
    busy_gi = next(i.gi_id for i in read_instances(nvml, GPU) if i.uuid == uuids["busy"])
    nvml.set_usage(0, processes=(ProcessSpec(pid=9, used_memory_bytes=1, gpu_instance_id=busy_gi, compute_instance_id=0),))

    after = MIGNode(nvml, OwnedFile(record))  # a new agent process: only the file and NVML remain
    destroyed = after.reconcile([GPU], live=[live])

    assert [i.uuid for i in destroyed] == [uuids["gone"]]
    left = {i.uuid for i in read_instances(nvml, GPU)}
    assert left == {"MIG-op", uuids["live"], uuids["busy"]}

    nvml.set_usage(0, processes=())
    assert [i.uuid for i in after.reconcile([GPU], live=[live])] == [uuids["busy"]]  # idle now: it goes


def test_a_lost_record_leaks_rather_than_destroys_but_live_allocations_still_count(tmp_path: Path) -> None:
    nvml = node()
    first = MIGNode(nvml, OwnedFile(tmp_path / "a.json"))
    keep, orphan = Want("keep", GPU, "1g.10gb", 0), Want("orphan", GPU, "1g.10gb", 1)
    first.prepare(keep, live=[keep, orphan])
    first.prepare(orphan, live=[keep, orphan])

    fresh = MIGNode(nvml, OwnedFile(tmp_path / "missing.json"))

    assert fresh.reconcile([GPU], live=[keep]) == []  # the orphan is no longer provably fgpu's: kept
    assert len(read_instances(nvml, GPU)) == 2
