"""After a restart the ledger is rebuilt with the MIG holds of running pods: two pods collide only on one GPU."""

from __future__ import annotations

from typing import Any

import pytest

from agent.admissionsweep import PodSeen
from agent.discovery import discover
from agent.ledger_rebuild import SkipReason, restored_admissions
from agent.pcitopology import InventoryTopology
from apis.allocation import Allocation, ContainerShare, GPUShare
from apis.devices import NodeDevices
from apis.signing import allocation_annotations
from tests.agent.helpers import INVENTORIES, started_fake
from tests.signing_keys import signing_key, verifying

KEY = signing_key("mig-ledger-rebuild")
NODE = "mig-node"
GiB = 2**30


def _devices() -> NodeDevices:
    nvml, inventory = started_fake(f"{INVENTORIES}/a100-2x-mig-dynamic.yaml")
    return discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices


DEVICES = _devices()
GPU0, GPU1 = DEVICES.gpus
(OPERATORS,) = GPU1.mig_instances  # an operator's 1g.10gb on GPU 1


def _pod(uid: str, minor: int, age: str, **mig: Any) -> PodSeen:
    gpu = DEVICES.gpus[minor]
    share = GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=30, memory_bytes=10 * GiB, memory_ratio_percent=12,
        containers=(ContainerShare("main", 30, 10 * GiB, 12),), **mig,
    )
    annotations = allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=(share,)))
    return PodSeen(uid=uid, name=f"ml/{uid}", annotations=annotations, started=True, created=age)


@pytest.mark.parametrize(
    ("pods", "restored", "overcommit"),
    [
        # The same placement on two GPUs is two instances (once keyed as "3g.40gb@4" alone: a collision).
        ([_pod("a", 0, "1", mig_profile="3g.40gb", mig_placement=4),
          _pod("b", 1, "2", mig_profile="3g.40gb", mig_placement=4)], {"a", "b"}, set()),
        # The same placement on one GPU, even of another profile, is one: the younger pod was refused.
        ([_pod("a", 0, "1", mig_profile="3g.40gb", mig_placement=4),
          _pod("b", 0, "2", mig_profile="2g.20gb", mig_placement=4)], {"a"}, {"b"}),
        # One instance named by UUID by one pod and by its placement by another.
        ([_pod("a", 1, "1", mig_uuid=OPERATORS.uuid),
          _pod("b", 1, "2", mig_profile=OPERATORS.profile, mig_placement=OPERATORS.placement_start)], {"a"}, {"b"}),
    ],
    ids=["same-placement-two-gpus", "same-placement-one-gpu", "uuid-and-placement"],
)
def test_mig_holds_collide_only_on_the_same_gpu(pods: list[PodSeen], restored: set[str], overcommit: set[str]) -> None:
    got = restored_admissions(pods, key=verifying(KEY), node_name=NODE, devices=DEVICES)

    assert {uid for uid, _ in got.entries} == restored
    assert {s.uid for s in got.skipped if s.reason is SkipReason.OVERCOMMIT} == overcommit
