"""The hook never admits a memory-only share (0% compute: no compute limit) beside another pod's compute, nor
compute beside another pod's memory-only share, whatever the scheduler signed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent.admissions import AdmissionLedger, Hold
from agent.discovery import discover
from agent.hook import HookRequest, HookSettings, decide, holds_of
from agent.isolation.registry import IsolationPaths
from agent.pcitopology import InventoryTopology
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, ShareLimit
from apis.devices import NodeDevices
from apis.signing import allocation_annotations
from tests.agent.helpers import T4, started_fake
from tests.signing_keys import signing_key, verifying

KEY = signing_key("cluster-key-for-tests")
NODE = "gpu-node-1"
GiB = 2**30


def _devices() -> NodeDevices:
    nvml, inventory = started_fake(T4)
    return discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices


DEVICES = _devices()


@dataclass(frozen=True)
class Ask:
    """One pod's share of one GPU, as the scheduler would sign it."""

    gpu: int
    core: int
    gib: int = 2
    #: a burstable limit on compute (the share then runs capped at it)
    core_limit: int | None = None

    def share(self) -> GPUShare:
        gpu = DEVICES.gpus[self.gpu]
        memory = self.gib * GiB
        ratio = -(-memory * 100 // gpu.memory_bytes)
        limit = None if self.core_limit is None else ShareLimit(self.core_limit, memory, ratio)
        return GPUShare(
            minor=gpu.minor, uuid=gpu.uuid, core_percent=self.core, memory_bytes=memory, memory_ratio_percent=ratio,
            containers=(ContainerShare("main", self.core, memory, ratio),), limit=limit,
        )


def _decide(uid: str, ask: Ask, ledger: AdmissionLedger, isolation: str) -> str:
    """Runs the hook for pod `uid` as the hook server does (the ledger's other pods held), and records
    it when admitted; the rejection, or "" when admitted."""
    annotations = allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=(ask.share(),)))
    decision = decide(
        HookRequest(pod_uid=uid, pod_namespace="ml", pod_name=uid, container_name="main", annotations=annotations),
        devices=DEVICES,
        settings=HookSettings(node_name=NODE, key=verifying(KEY), isolation=isolation, paths=IsolationPaths()),
        held=ledger.held(excluding=uid),
    )
    if not decision.rejection:
        assert decision.edits is not None
        ledger.record(pod_uid=uid, holds=decision.holds)
    return decision.rejection


@dataclass(frozen=True)
class Case:
    name: str
    admitted: tuple[Ask, ...]
    pod: Ask
    #: words the rejection holds; empty: the pod is admitted
    refused: tuple[str, ...] = ()


G0 = DEVICES.gpus[0].uuid
CASES = [
    Case(
        "memory only beside a pod holding the card's whole compute (the review's case)",
        (Ask(0, 100),),
        Ask(0, 0),
        (
            f"GPU {G0}: this pod's share is GPU memory only",
            "no compute limit",
            "1 pod(s) already admitted on this node (admitted-0) hold 100% of the card's compute",
            f"ask for a compute share too ({names.GPU_CORE})",
        ),
    ),
    Case(
        "memory only beside any compute, even 10% of two pods",
        (Ask(0, 5), Ask(0, 5)),
        Ask(0, 0),
        ("2 pod(s) already admitted on this node (admitted-0, admitted-1) hold 10% of the card's compute",),
    ),
    Case("memory only beside other memory-only shares", (Ask(0, 0), Ask(0, 0)), Ask(0, 0)),
    Case("memory only on a card whose compute others hold elsewhere", (Ask(1, 100),), Ask(0, 0)),
    Case(
        "compute beside a memory-only share",
        (Ask(0, 0),),
        Ask(0, 30),
        (
            f"GPU {G0}: this pod's 30% of compute would share the card with the memory-only share of "
            "1 pod(s) already admitted on this node (admitted-0)",
            "the pod must be scheduled again",
        ),
    ),
    Case("compute beside compute", (Ask(0, 30),), Ask(0, 30)),
    Case(
        "a burstable share with a compute limit is capped, so it is not memory-only",
        (Ask(0, 0, core_limit=50),),
        Ask(0, 30),
    ),
    Case(
        "memory only beside a burstable share that reserved no compute",
        (Ask(0, 0, core_limit=50),),
        Ask(0, 0),
    ),
]


@pytest.mark.parametrize("isolation", [names.ISOLATION_HAMI_CORE, names.ISOLATION_MPS])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_memory_only_and_compute_shares_of_different_pods_never_share_a_card(case: Case, isolation: str) -> None:
    ledger = AdmissionLedger()
    for n, ask in enumerate(case.admitted):
        assert _decide(f"admitted-{n}", ask, ledger, isolation) == ""
    rejection = _decide("newcomer", case.pod, ledger, isolation)
    if not case.refused:
        assert rejection == ""
        return
    for words in case.refused:
        assert words in rejection, rejection
    assert "newcomer" not in ledger.pods()


def test_the_ledger_counts_memory_only_holders_per_gpu() -> None:
    ledger = AdmissionLedger()
    ledger.record(pod_uid="a", holds=[Hold(gpu_uuid="GPU-0", memory_bytes=GiB, memory_only=True)])
    ledger.record(pod_uid="b", holds=[Hold(gpu_uuid="GPU-0", core_percent=20, memory_bytes=GiB)])
    held = ledger.held()["GPU-0"]
    assert (held.core_percent, held.pods, held.memory_only_pods) == (20, frozenset({"a", "b"}), frozenset({"a"}))
    assert ledger.held(excluding="a")["GPU-0"].memory_only_pods == frozenset()


@pytest.mark.parametrize(
    ("ask", "memory_only"),
    [(Ask(0, 0), True), (Ask(0, 30), False), (Ask(0, 0, core_limit=50), False)],
)
def test_the_ledger_rebuilt_after_a_restart_knows_memory_only_shares(ask: Ask, memory_only: bool) -> None:
    (hold,) = holds_of(Allocation(gpus=(ask.share(),)), DEVICES)
    assert hold.memory_only is memory_only


def test_a_card_mixed_before_the_rule_names_only_the_pods_holding_compute() -> None:
    """Pods admitted by an older agent may mix; rebuilt into the ledger, they still refuse memory-only shares."""
    ledger = AdmissionLedger()
    for uid, ask in (("old-memory-only", Ask(0, 0)), ("old-compute", Ask(0, 20))):
        ledger.record(pod_uid=uid, holds=holds_of(Allocation(gpus=(ask.share(),)), DEVICES))
    rejection = _decide("newcomer", Ask(0, 0), ledger, names.ISOLATION_HAMI_CORE)
    assert "1 pod(s) already admitted on this node (old-compute) hold 20% of the card's compute" in rejection
    assert "newcomer" not in ledger.pods()
    # and, admitted before the rule, a compute pod's restart is refused too: it would run beside no limit
    assert "memory-only share of 1 pod(s) already admitted on this node (old-memory-only)" in _decide(
        "old-compute", Ask(0, 20), ledger, names.ISOLATION_HAMI_CORE
    )
