"""The view serves at once and refreshes in the background: the views and the defrag plan apart, the plan within its budget."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Iterator

import pytest

from fgpuctl import ui_model, ui_plan, ui_render, ui_server, ui_sources
from fgpuctl.main import main as fgpuctl
from fgpuctl.ui_model import Gathered, Planning, PlanState, PlanStatus
from tests.webview.conftest import SEEDED
from tests.webview.test_view import get

PLAN = {"moves": [], "note": "a stand-in plan"}


@pytest.fixture(scope="module")
def seeded() -> Gathered:
    return ui_sources.from_snapshot_file(str(SEEDED))()


@pytest.fixture
def servers() -> Iterator[list[ui_server.UIServer]]:
    started: list[ui_server.UIServer] = []
    yield started
    for server in started:
        server.stop(1.0)


def start(servers: list[ui_server.UIServer], state: ui_server.ViewState) -> str:
    server = ui_server.UIServer(state, host="127.0.0.1", port=0)
    server.start()
    servers.append(server)
    host, port = server.address
    return f"http://{host}:{port}"


class HeldPlanner:
    """A planner that holds each plan until released, and counts the plans asked for."""

    budget_s = 60.0

    def __init__(self) -> None:
        self.release = threading.Event()
        self.asked = 0

    def run(self, planning: Planning) -> ui_plan.PlanOutcome:
        self.asked += 1
        self.release.wait(30)
        return ui_plan.PlanOutcome(PLAN, "", 0.5)

    def stop(self) -> None:
        self.release.set()


def test_the_server_answers_before_the_first_sample_and_says_it_is_gathering(
    seeded: Gathered, servers: list[ui_server.UIServer]
) -> None:
    gate = threading.Event()

    def slow() -> Gathered:
        gate.wait(30)
        return seeded

    state = ui_server.ViewState(slow, interval_s=3600, history_s=3600, source="snapshot big.json")
    url = start(servers, state)

    status, _, page = get(url + "/")
    assert status == 200 and b"gathering cluster state" in page and b"reading snapshot big.json" in page
    assert b"<meta http-equiv=refresh content=2>" in page  # reloads itself: the page runs no script
    status, _, body = get(url + "/cluster.json?ns=team-a")
    doc = json.loads(body)
    assert status == 200 and doc["ready"] is False and doc["error"] == "" and doc["source"] == "snapshot big.json"
    assert "nodes" not in doc and doc["refresh"]["intervalSeconds"] == 3600

    gate.set()
    assert state.ready.wait(10)
    doc = json.loads(get(url + "/cluster.json")[2])
    assert doc["ready"] is True and [n["name"] for n in doc["nodes"]] == ["gpu-a", "gpu-b", "gpu-c"]
    assert doc["defragStatus"] == {"state": "off", "reason": "defrag plans are turned off (--defrag-interval 0)",
                                   "plannedAt": None, "tookSeconds": None}


def test_a_first_sample_that_fails_is_shown_and_the_next_one_replaces_it(seeded: Gathered) -> None:
    answers: list[Exception | Gathered] = [ui_sources.SourceError("--kubeconfig=k: connection refused"), seeded]

    def collect() -> Gathered:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    state = ui_server.ViewState(collect, interval_s=30, history_s=3600, source="kubeconfig k")
    assert state.refresh() is False
    doc = state.document()
    assert doc["ready"] is False and doc["error"] == "--kubeconfig=k: connection refused"
    assert state.refresh() is True
    assert state.document()["ready"] is True and state.first_error == ""


def test_views_stay_fresh_while_a_slow_plan_is_being_made(seeded: Gathered, servers: list[ui_server.UIServer]) -> None:
    planner = HeldPlanner()
    samples = {"n": 0}

    def collect() -> Gathered:
        samples["n"] += 1
        return seeded

    state = ui_server.ViewState(collect, interval_s=0.05, history_s=3600, planner=planner, plan_interval_s=3600)
    url = start(servers, state)
    assert state.ready.wait(10)

    # The plan is held; the views are sampled again and again meanwhile, and the page says the plan is coming.
    for _ in range(200):
        if samples["n"] >= 4:
            break
        threading.Event().wait(0.05)
    doc = json.loads(get(url + "/cluster.json")[2])
    assert samples["n"] >= 4 and planner.asked == 1 and not state.planned.is_set()
    assert doc["ready"] and doc["defrag"] is None and doc["defragStatus"]["state"] == "pending"
    assert b"the first plan is being made" in get(url + "/")[2]

    planner.release.set()
    assert state.planned.wait(10)
    doc = json.loads(get(url + "/cluster.json")[2])
    assert doc["defrag"] == PLAN and doc["defragStatus"]["state"] == "current" and doc["defragStatus"]["tookSeconds"] == 0.5


def test_a_plan_past_its_budget_is_stopped_and_the_page_says_so_and_shows_the_last_good_plan(seeded: Gathered) -> None:
    runner = ui_plan.PlanRunner(ui_plan.DefragShape(), budget_s=0.001)
    state = ui_server.ViewState(lambda: seeded, interval_s=30, history_s=3600, planner=runner, plan_interval_s=60,
                                clock=lambda: 1_700_000_000.0)
    state.refresh()

    state.refresh_plan()  # far too short a budget: no plan to show
    status = state.document()["defragStatus"]
    assert status["state"] == "unavailable" and state.document()["defrag"] is None
    assert "ran past its budget of 0.001 s (--defrag-budget) on 3 nodes and was stopped" in status["reason"]
    # the child was killed and reaped, not left running
    assert [c for c in multiprocessing.active_children() if c.name == "fgpuctl-ui-defrag"] == []

    runner.budget_s = 60
    state.refresh_plan()
    doc = state.document()
    assert doc["defragStatus"]["state"] == "current" and doc["defragStatus"]["plannedAt"] == "2023-11-14T22:13:20Z"
    assert [m["pod"] for m in doc["defrag"]["moves"]] == ["team-b/infer-3"]

    runner.budget_s = 0.001
    state.refresh_plan()
    stale = state.document()
    assert stale["defragStatus"]["state"] == "stale" and stale["defrag"] == doc["defrag"]
    assert "ran past its budget" in stale["defragStatus"]["reason"]
    assert "showing the plan made on the sample of 2023-11-14T22:13:20Z" in stale["defragStatus"]["reason"]
    page = ui_render.page(ui_model.filtered(stale, ui_model.Query()))
    assert "<p id=defrag-status class=stale data-state=stale>stale: the plan ran past its budget" in page
    assert "<li class=move data-pod='team-b/infer-3'>" in page  # the last good plan, still shown


@pytest.mark.parametrize(
    ("previous", "plan", "failure", "state", "shown"),
    [
        (PlanStatus(PlanState.PENDING), PLAN, "", PlanState.CURRENT, PLAN),
        (PlanStatus(PlanState.PENDING), None, "it broke", PlanState.UNAVAILABLE, None),
        (PlanStatus(PlanState.CURRENT, plan={"old": 1}, planned_at=5.0), None, "it broke", PlanState.STALE, {"old": 1}),
        (PlanStatus(PlanState.STALE, plan={"old": 1}, planned_at=5.0), PLAN, "", PlanState.CURRENT, PLAN),
        (PlanStatus(PlanState.UNAVAILABLE, reason="x"), None, "again", PlanState.UNAVAILABLE, None),
    ],
)
def test_a_settled_plan_attempt_decides_which_plan_is_shown(
    previous: PlanStatus, plan: dict[str, object] | None, failure: str, state: PlanState, shown: object
) -> None:
    after = ui_model.plan_settled(previous, plan=plan, failure=failure, took_s=1.23456, sampled_at=60.0)
    assert after.state is state and after.plan == shown
    assert (failure in after.reason) if failure else after.reason == ""
    assert after.planned_at == (60.0 if plan else previous.planned_at)


def test_a_cluster_that_cannot_be_planned_on_says_why_and_the_views_still_show(seeded: Gathered) -> None:
    from dataclasses import replace

    unplannable = replace(seeded, planning=None, notes=("no fragmentation or defrag plan: no GPU node reports Devices yet",))
    state = ui_server.ViewState(lambda: unplannable, interval_s=30, history_s=3600, planner=HeldPlanner())
    state.refresh()
    state.refresh_plan()
    doc = state.document()
    assert doc["ready"] and len(doc["nodes"]) == 3
    assert doc["defragStatus"]["state"] == "unavailable" and "no GPU node reports Devices yet" in doc["defragStatus"]["reason"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--defrag-budget", "0"], "--defrag-budget 0.0: give more than 0 and at most 3600 seconds"),
        (["--defrag-interval", "0.5"], "--defrag-interval 0.5: give at least 1 second, or 0 to turn plans off"),
        (["--interval", "0"], "--interval 0.0 / --history-hours 6.0: give at least 1 second"),
    ],
)
def test_refresh_flags_out_of_range_are_refused_naming_the_flag(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fgpuctl(["ui", "--snapshot", str(SEEDED), "--listen", "127.0.0.1:0", *flags]) == 2
    assert message in capsys.readouterr().err
