"""Which sandbox admitted a pod: a stop of another of its sandboxes leaves the pod's entry alone."""

from __future__ import annotations

import pytest

from agent.admissions import AdmissionLedger, Hold

HOLD = Hold(gpu_uuid="GPU-a", core_percent=30, memory_bytes=1 << 30)


@pytest.mark.parametrize(
    ("admitted_in", "stopped", "runs_elsewhere"),
    [
        ("sb-new", "sb-old", True),  # kubelet re-created the sandbox; the old one's stop came late
        ("sb-new", "sb-new", False),  # the pod's own sandbox stopped
        ("", "sb-old", False),  # restored after an agent restart: the sandbox is not known
        ("sb-new", "", False),  # a stop that names no sandbox
    ],
)
def test_a_stop_of_another_sandbox_than_the_one_that_admitted_the_pod_leaves_it_running(
    admitted_in: str, stopped: str, runs_elsewhere: bool
) -> None:
    ledger = AdmissionLedger()
    ledger.record(pod_uid="p", holds=[HOLD], sandbox_id=admitted_in)
    assert ledger.runs_in_another_sandbox(pod_uid="p", sandbox_id=stopped) is runs_elsewhere


def test_the_last_container_admitted_says_which_sandbox_the_pod_runs_in_and_a_release_forgets_it() -> None:
    ledger = AdmissionLedger()
    ledger.record(pod_uid="p", holds=[HOLD], sandbox_id="sb-old")
    ledger.record(pod_uid="p", holds=[HOLD], sandbox_id="sb-new")
    assert ledger.runs_in_another_sandbox(pod_uid="p", sandbox_id="sb-old")
    assert ledger.release(pod_uid="p")
    assert not ledger.runs_in_another_sandbox(pod_uid="p", sandbox_id="sb-old")
    assert not ledger.runs_in_another_sandbox(pod_uid="unknown", sandbox_id="sb-old")


def test_a_rebuilt_entry_knows_its_sandbox_where_the_listing_said() -> None:
    ledger = AdmissionLedger()
    restored = ledger.restore([("p", (HOLD,)), ("q", (HOLD,))], sandboxes={"p": "sb-new"})
    assert restored == ["p", "q"]
    assert ledger.runs_in_another_sandbox(pod_uid="p", sandbox_id="sb-old")
    assert not ledger.runs_in_another_sandbox(pod_uid="q", sandbox_id="sb-old")  # not known: a stop frees it
