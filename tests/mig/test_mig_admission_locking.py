"""A MIG create or destroy runs without the admission ledger's lock, and the claim it makes keeps it safe.

The hook claims the placement in the ledger, creates without the lock, then confirms or rolls back
(docs/mig.md, "Locks"). Through the real servicer, ledger and MIG code over a fake NVML whose create or
destroy is slow, as `tests/review/test_mig_review.py` wires them.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.mig_nvml import read_instances
from apis.fgpu.v1 import hooks_pb2
from tests.review.test_mig_review import INVENTORY, Node, SlowCreate, by_placement, by_uuid, visible

SLOW_S = 1.0


class SlowDestroy(FakeNVML):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.destroying = threading.Event()

    def nvmlGpuInstanceDestroy(self, gi: Any) -> None:
        self.destroying.set()
        time.sleep(SLOW_S)
        super().nvmlGpuInstanceDestroy(gi)


def slow_node(tmp_path: Path, cls: type[FakeNVML]) -> tuple[Node, Any]:
    nvml = cls(load_inventory(INVENTORY))
    nvml.nvmlInit()
    return Node(tmp_path, nvml=nvml), nvml


def in_background(call: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call(*args)))
    thread.start()
    return thread, out


def test_a_second_pod_for_a_placement_being_created_is_refused_at_once_and_the_first_gets_it(tmp_path: Path) -> None:
    node, nvml = slow_node(tmp_path, SlowCreate)
    thread, first = in_background(node.create, "slow", by_placement("slow", node.gpu0, "3g.40gb", 4))
    try:
        assert nvml.creating.wait(5.0)
        started = time.monotonic()
        second = node.create("late", by_placement("late", node.gpu0, "3g.40gb", 4))
        waited = time.monotonic() - started
    finally:
        thread.join()

    assert second.HasField("rejection") and "already held by pod slow" in second.rejection.reason
    assert waited < 0.5, f"the refusal waited {waited:.2f}s for the other pod's create"
    made = visible(first[0])
    assert [i.uuid for i in read_instances(node.nvml, node.gpu0)] == [made]
    assert set(node.ledger.pods()) == {"slow"}
    assert node.ledger.pods()["slow"][0].mig_uuid == made  # the claim confirmed with the UUID made


def test_a_refused_create_rolls_the_claim_back(tmp_path: Path) -> None:
    node = Node(tmp_path)
    (operators,) = read_instances(node.nvml, node.gpu1)
    # The scheduler's view was stale: the operator's 1g.10gb sits where the allocation asks fgpu to create one.
    refused = node.create("p", by_placement("p", node.gpu1, "1g.10gb", operators.placement_start, minor=1))

    assert refused.HasField("rejection") and "an operator's 1g.10gb instance" in refused.rejection.reason
    assert node.ledger.pods() == {}
    # The placement is not left claimed: another pod may have the operator's instance by UUID.
    assert visible(node.create("q", by_uuid("q", node.gpu1, operators.uuid, minor=1))) == operators.uuid


def test_a_pod_stopped_while_its_instance_is_made_is_refused_and_the_instance_goes(tmp_path: Path) -> None:
    node, nvml = slow_node(tmp_path, SlowCreate)
    thread, first = in_background(node.create, "slow", by_placement("slow", node.gpu0, "3g.40gb", 4))
    try:
        assert nvml.creating.wait(5.0)
        node.stop("slow")  # PostStopPodSandbox: its destroy waits for the create on the GPU, not the ledger
    finally:
        thread.join()

    response: hooks_pb2.HookResponse = first[0]
    assert response.HasField("rejection") and "sandbox stopped" in response.rejection.reason
    assert node.ledger.pods() == {}
    assert read_instances(node.nvml, node.gpu0) == []


def test_a_slow_destroy_holds_up_no_admission_and_its_instance_is_not_handed_out_meanwhile(tmp_path: Path) -> None:
    node, nvml = slow_node(tmp_path, SlowDestroy)
    (operators,) = read_instances(node.nvml, node.gpu1)
    made = visible(node.create("w", by_placement("w", node.gpu0, "3g.40gb", 4)))
    node.devices = node.discover()  # the scheduler's next report lists the instance
    thread, _ = in_background(node.stop, "w")
    try:
        assert nvml.destroying.wait(5.0)
        started = time.monotonic()
        other = node.create("other", by_uuid("other", node.gpu1, operators.uuid, minor=1))
        waited = time.monotonic() - started
        # A scheduler that took the instance being destroyed for free, naming it by UUID.
        stale = node.create("stale", by_uuid("stale", node.gpu0, made))
    finally:
        thread.join()

    assert visible(other) == operators.uuid
    assert waited < SLOW_S / 2, f"an admission on another GPU waited {waited:.2f}s for a destroy"
    assert stale.HasField("rejection") and "destroyed by fgpu" in stale.rejection.reason
    assert read_instances(node.nvml, node.gpu0) == []
    assert set(node.ledger.pods()) == {"other"}
