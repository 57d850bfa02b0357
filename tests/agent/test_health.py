"""The health state machine, table-driven: observations in, transitions out."""

from __future__ import annotations

import pytest

from agent.health import HealthTracker, Transition

GPU = "GPU-1"


def _run(tracker: HealthTracker, steps: list[tuple[float, str, object]]) -> list[Transition | None]:
    out: list[Transition | None] = []
    for now, kind, value in steps:
        if kind == "xid":
            assert isinstance(value, int)
            out.append(tracker.on_xid(GPU, value, now=now))
        else:
            out.append(tracker.on_check(GPU, ok=bool(value), now=now, reason="lost"))
    return out


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_leave_the_gpu_healthy(xid: int) -> None:
    tracker = HealthTracker()
    assert tracker.on_xid(GPU, xid, now=0) is None
    assert tracker.state(GPU).healthy


@pytest.mark.parametrize(("xid", "reason"), [(48, "Xid48"), (79, "Xid79"), (94, "Xid94")])
def test_other_xids_mark_the_gpu_unhealthy_with_the_xid_as_reason(xid: int, reason: str) -> None:
    tracker = HealthTracker()
    transition = tracker.on_xid(GPU, xid, now=5)
    assert transition == Transition(uuid=GPU, healthy=False, reason=reason, at=5)
    assert (tracker.state(GPU).healthy, tracker.state(GPU).reason) == (False, reason)


def test_the_ignored_set_is_configurable() -> None:
    tracker = HealthTracker(application_xids={48})
    assert tracker.on_xid(GPU, 48, now=0) is None
    assert tracker.on_xid(GPU, 13, now=0) is not None


def test_a_gpu_recovers_after_a_quiet_period_of_successful_checks() -> None:
    tracker = HealthTracker(quiet_period_s=60)
    results = _run(tracker, [(0, "xid", 48), (30, "check", True), (59.9, "check", True), (60, "check", True)])
    assert results[:3] == [Transition(uuid=GPU, healthy=False, reason="Xid48", at=0), None, None]
    assert results[3] is not None and results[3].healthy
    assert tracker.state(GPU).healthy


def test_a_new_failure_restarts_the_quiet_period_without_a_second_transition() -> None:
    tracker = HealthTracker(quiet_period_s=60)
    results = _run(tracker, [(0, "xid", 48), (50, "xid", 48), (100, "check", True), (110, "check", True)])
    assert results[1] is None  # same reason again: nothing new to announce
    assert results[2] is None  # only 50 s since the last Xid
    assert results[3] is not None and results[3].healthy


def test_a_different_failure_while_unhealthy_is_announced() -> None:
    tracker = HealthTracker()
    _run(tracker, [(0, "xid", 48)])
    transition = tracker.on_check(GPU, ok=False, now=1, reason="lost: NVMLError_GpuIsLost")
    assert transition is not None and transition.reason == "lost: NVMLError_GpuIsLost"


def test_a_failed_check_marks_the_gpu_unhealthy() -> None:
    tracker = HealthTracker()
    assert _run(tracker, [(0, "check", False)]) == [Transition(uuid=GPU, healthy=False, reason="lost", at=0)]


def test_successful_checks_on_a_healthy_gpu_change_nothing() -> None:
    assert _run(HealthTracker(), [(0, "check", True), (1, "check", True)]) == [None, None]


def test_a_negative_quiet_period_is_refused() -> None:
    with pytest.raises(ValueError, match="quiet period"):
        HealthTracker(quiet_period_s=-1)


def test_forgetting_drops_gpus_no_longer_present() -> None:
    tracker = HealthTracker()
    tracker.on_xid("GPU-1", 48, now=0)
    tracker.on_xid("GPU-2", 48, now=0)
    tracker.forget(["GPU-2"])
    assert set(tracker.states()) == {"GPU-2"}
