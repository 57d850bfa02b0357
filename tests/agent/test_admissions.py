"""The admission ledger: what admitted pods hold per GPU, idempotent per pod UID."""

from __future__ import annotations

from agent.admissions import AdmissionLedger, GPUHeld, Hold

GiB = 2**30


def test_holds_of_several_pods_add_up_per_gpu() -> None:
    ledger = AdmissionLedger()
    ledger.record(pod_uid="a", holds=[Hold(gpu_uuid="GPU-0", core_percent=30, memory_bytes=GiB)])
    ledger.record(pod_uid="b", holds=[Hold(gpu_uuid="GPU-0", core_percent=20, memory_bytes=2 * GiB)])
    assert ledger.held() == {"GPU-0": GPUHeld(core_percent=50, memory_bytes=3 * GiB, pods=frozenset({"a", "b"}))}


def test_recording_the_same_pod_again_replaces_its_entry_instead_of_adding() -> None:
    ledger = AdmissionLedger()
    for _ in range(3):  # a restart and two containers of one pod
        ledger.record(pod_uid="a", holds=[Hold(gpu_uuid="GPU-0", core_percent=40, memory_bytes=GiB)])
    assert ledger.held()["GPU-0"].core_percent == 40


def test_a_pod_is_left_out_of_what_is_held_by_others() -> None:
    ledger = AdmissionLedger()
    ledger.record(pod_uid="a", holds=[Hold(gpu_uuid="GPU-0", core_percent=40)])
    ledger.record(pod_uid="b", holds=[Hold(gpu_uuid="GPU-1", core_percent=10)])
    assert set(ledger.held(excluding="a")) == {"GPU-1"}


def test_releasing_a_pod_frees_its_shares_and_unknown_pods_are_fine() -> None:
    ledger = AdmissionLedger()
    ledger.record(pod_uid="a", holds=[Hold(gpu_uuid="GPU-0", core_percent=40)])
    assert ledger.release(pod_uid="a")
    assert not ledger.release(pod_uid="a")
    assert ledger.held() == {}


def test_mig_instances_are_held_by_pod_not_summed_into_the_gpu() -> None:
    ledger = AdmissionLedger()
    ledger.record(pod_uid="a", holds=[Hold(gpu_uuid="GPU-0", mig_uuid="MIG-1", core_percent=100)])
    held = ledger.held()["GPU-0"]
    assert held.core_percent == 0 and held.pods == frozenset()
    assert held.mig == {"MIG-1": frozenset({"a"})}
