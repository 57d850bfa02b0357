"""Which nodes take pods: Node facts and Device reports arriving and leaving in any order, and an
inventory that lists one GPU twice."""

from __future__ import annotations

import dataclasses

import pytest

from apis.devices import DeviceError
from scheduler_plugin.core.api import NodeName, SchedulingError
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import gpu, info, node, pod, whole

N1 = NodeName("n1")


def _feasible(scheduler: Scheduler, name: str = "n1") -> bool:
    [verdict] = scheduler.filter(pod("p", whole(1)), [NodeName(name)])
    return verdict.feasible


def test_with_node_info_required_a_device_alone_is_no_node() -> None:
    scheduler = Scheduler(require_node_info=True)
    scheduler.upsert_node_devices(node("n1", 1))
    [verdict] = scheduler.filter(pod("p", whole(1)), [N1])
    assert not verdict.feasible and verdict.unresolvable and "not known" in verdict.reason
    assert scheduler.select(pod("p", whole(1))) is None
    scheduler.upsert_node_info(info("n1"))
    assert scheduler.select(pod("p", whole(1))) == N1


def test_a_device_that_outlives_its_deleted_node_never_makes_it_schedulable_again() -> None:
    scheduler = Scheduler(require_node_info=True)
    scheduler.upsert_node_info(info("n1"))
    scheduler.upsert_node_devices(node("n1", 1))
    scheduler.remove_node(N1)
    scheduler.upsert_node_devices(node("n1", 1))  # a relist sees the Device the collector has not deleted yet
    assert scheduler.select(pod("p", whole(1))) is None
    assert not _feasible(scheduler)
    with pytest.raises(SchedulingError, match="not known"):
        scheduler.reserve(pod("p", whole(1)), N1)
    # The Node comes back (same name): the Device it kept is its inventory again.
    scheduler.upsert_node_info(info("n1"))
    assert scheduler.reserve(pod("p", whole(1)), N1).uuids == ("GPU-n1-0",)


def test_without_the_requirement_a_device_report_alone_makes_a_node() -> None:
    scheduler = Scheduler()  # the embedded store and the simulators: reports are the only record
    scheduler.upsert_node_devices(node("n1", 1))
    assert scheduler.select(pod("p", whole(1))) == N1


def test_turning_the_requirement_on_applies_to_nodes_already_known() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("n1", 1))
    scheduler.upsert_node_info(info("n2"))
    scheduler.upsert_node_devices(node("n2", 1))
    scheduler.require_node_info = True
    assert scheduler.select(pod("p", whole(1))) == NodeName("n2")
    assert not _feasible(scheduler, "n1")
    scheduler.require_node_info = False
    assert _feasible(scheduler, "n1")


def test_a_gpu_listed_twice_is_refused_naming_both_entries_and_the_node_keeps_what_it_had() -> None:
    scheduler = Scheduler()
    good = node("n1", 2)
    scheduler.upsert_node_devices(good)
    first, second = good.gpus
    doubled = dataclasses.replace(good, gpus=(first, dataclasses.replace(second, uuid=first.uuid)))
    with pytest.raises(DeviceError, match=r"GPU 1 \(index 1, minor 1\) has UUID 'GPU-n1-0', which GPU 0 \(index 0"):
        scheduler.upsert_node_devices(doubled)
    [view] = scheduler.node_views([N1])
    assert [g.device.uuid for g in view.gpus] == ["GPU-n1-0", "GPU-n1-1"]
    held = [scheduler.reserve(pod(f"p{i}", whole(1)), N1).uuids for i in range(2)]
    assert sorted(held) == [("GPU-n1-0",), ("GPU-n1-1",)]
    assert not _feasible(scheduler)


def test_a_mig_instance_listed_twice_is_refused() -> None:
    scheduler = Scheduler()
    base = gpu("n1", 0, mig=[("1g.10gb", 10), ("1g.10gb", 10)])
    instances = base.mig_instances
    repeated = dataclasses.replace(
        base, mig_instances=(instances[0], dataclasses.replace(instances[1], uuid=instances[0].uuid))
    )
    with pytest.raises(DeviceError, match="MIG instance 1 has UUID"):
        scheduler.upsert_node_devices(dataclasses.replace(node("n1", 0), gpus=(repeated,)))
    assert scheduler.node_views([N1]) == []
