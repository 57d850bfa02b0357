"""The sweep's shared decision core and its two PodSource folds, without any peer."""

from __future__ import annotations

import pytest

from agent.admissions import AdmissionLedger, Hold
from agent.admissionsweep import AdmissionSweeper, PodSeen, SweepReason, stale_admissions
from agent.criclient import Sandbox
from agent.errors import RuntimeUnavailable
from agent.metrics import AgentMetrics
from agent.podsources import pods_seen, sandboxes_seen

GRACE = 120.0
NOW = 1000.0
OLD = NOW - GRACE - 1


@pytest.mark.parametrize(
    ("pods", "admitted", "expected"),
    [
        pytest.param([], OLD, {"p": SweepReason.GONE}, id="not-listed-is-gone"),
        pytest.param([PodSeen("p")], OLD, {}, id="running-stays"),
        pytest.param([PodSeen("p", finished=True)], OLD, {"p": SweepReason.FINISHED}, id="finished-is-released"),
        pytest.param([PodSeen("p", finished=True), PodSeen("p")], OLD, {}, id="an-old-stopped-and-a-new-ready-sandbox-stay"),
        pytest.param([PodSeen("p", finished=True)] * 2, OLD, {"p": SweepReason.FINISHED}, id="all-listings-finished"),
        pytest.param([], NOW - GRACE + 1, {}, id="inside-the-grace-stays-even-unlisted"),
        pytest.param([PodSeen("other")], OLD, {"p": SweepReason.GONE}, id="another-pod-does-not-keep-it"),
    ],
)
def test_which_entries_are_stale(pods: list[PodSeen], admitted: float, expected: dict[str, SweepReason]) -> None:
    assert stale_admissions({"p": admitted}, pods, listed_at=NOW, grace_s=GRACE) == expected


def test_kubernetes_phases_succeeded_and_failed_are_finished_and_a_pod_without_uid_is_skipped() -> None:
    items = [
        {"metadata": {"uid": "a"}, "status": {"phase": "Running"}},
        {"metadata": {"uid": "b"}, "status": {"phase": "Succeeded"}},
        {"metadata": {"uid": "c"}, "status": {"phase": "Failed"}},
        {"metadata": {"uid": "d"}},
        {"metadata": {}, "status": {"phase": "Failed"}},
    ]
    assert pods_seen(items) == [
        PodSeen("a"), PodSeen("b", finished=True), PodSeen("c", finished=True), PodSeen("d"),
    ]


def test_a_notready_sandbox_is_a_finished_pod_and_a_sandbox_without_pod_uid_is_skipped() -> None:
    sandboxes = [Sandbox(id="s1", pod_uid="a", ready=True), Sandbox(id="s2", pod_uid="b", ready=False),
                 Sandbox(id="s3", pod_uid="", ready=False)]
    assert sandboxes_seen(sandboxes) == [PodSeen("a", sandbox_id="s1"), PodSeen("b", finished=True, sandbox_id="s2")]


class FakePods:
    """A PodSource that returns what the test sets, or raises."""

    where = "on node test (fake)"

    def __init__(self) -> None:
        self.pods: list[PodSeen] = []
        self.error: Exception | None = None

    def list_pods(self) -> list[PodSeen]:
        if self.error is not None:
            raise self.error
        return list(self.pods)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def test_the_sweeper_releases_what_the_core_names_from_any_source_and_a_failed_list_releases_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    ledger = AdmissionLedger(clock=clock)
    metrics = AgentMetrics()
    source = FakePods()
    sweeper = AdmissionSweeper(source, ledger=ledger, metrics=metrics, grace_s=GRACE, clock=clock)
    for uid in ("running", "stopped", "gone"):
        ledger.record(pod_uid=uid, holds=[Hold(gpu_uuid="GPU-0", core_percent=10)])
    source.pods = [PodSeen("running"), PodSeen("stopped", finished=True)]
    clock.now += GRACE + 1
    source.error = RuntimeUnavailable("runtime down")
    with pytest.raises(RuntimeUnavailable):
        sweeper.sweep()
    assert set(ledger.pods()) == {"running", "stopped", "gone"}
    source.error = None
    assert sweeper.sweep() == {"stopped": SweepReason.FINISHED, "gone": SweepReason.GONE}
    assert set(ledger.pods()) == {"running"}
    assert metrics.registry.get_sample_value("fgpu_agent_admissions_swept_total", {"reason": "finished"}) == 1
    assert metrics.registry.get_sample_value("fgpu_agent_admissions_swept_total", {"reason": "gone"}) == 1
    assert "pod stopped is finished on node test (fake) but still held GPU shares (GPU-0)" in caplog.text
