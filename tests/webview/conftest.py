"""The web view's fixtures: a `fgpuctl ui` server on a free loopback port, and headless Chromium.

The browsers are shared by a module's tests (starting Chromium costs about a second each time).

Screenshots go to $FGPU_TEST_ARTIFACTS/webview when that is set (CI keeps them), else to the
test's tmp_path.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from fgpuctl import ui_plan, ui_server, ui_sources
from fgpuctl.ui_model import Gathered

SEEDED = Path(__file__).with_name("seeded_cluster.json")


class Serve(Protocol):
    def __call__(self, collect: Callable[[], Gathered], *, plan: bool = ..., wait: bool = ...) -> str: ...


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Starts a view over `collect` (with a defrag plan unless `plan=False`); returns its base URL
    once the first sample and the first plan are in (at once with `wait=False`)."""
    servers: list[ui_server.UIServer] = []

    def start(collect: Callable[[], Gathered], *, plan: bool = True, wait: bool = True) -> str:
        planner = ui_plan.PlanRunner(ui_plan.DefragShape(), budget_s=60) if plan else None
        state = ui_server.ViewState(collect, interval_s=3600, history_s=6 * 3600, source="test", planner=planner,
                                    plan_interval_s=3600)
        server = ui_server.UIServer(state, host="127.0.0.1", port=0)
        server.start()
        servers.append(server)
        if wait:
            assert state.ready.wait(30), state.document()
            assert not plan or state.planned.wait(60), state.document()["defragStatus"]
        host, port = server.address
        return f"http://{host}:{port}"

    yield start
    for server in servers:
        server.stop(1.0)


@pytest.fixture(scope="module")
def seeded_url() -> Iterator[str]:
    """A view of the seeded snapshot with its defrag plan, shared by a module's tests (it is read-only)."""
    state = ui_server.ViewState(ui_sources.from_snapshot_file(str(SEEDED)), interval_s=3600, history_s=6 * 3600,
                                planner=ui_plan.PlanRunner(ui_plan.DefragShape(), budget_s=60), plan_interval_s=3600)
    server = ui_server.UIServer(state, host="127.0.0.1", port=0)
    server.start()
    try:
        assert state.ready.wait(30) and state.planned.wait(60), state.document()
        host, port = server.address
        yield f"http://{host}:{port}"
    finally:
        server.stop(1.0)


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    root = os.environ.get("FGPU_TEST_ARTIFACTS")
    out = Path(root) / "webview" if root else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    return out


def _driver() -> Any:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.skip("headless Chromium absent: apt-get install chromium chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1800"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = _driver()
    yield driver
    driver.quit()


@pytest.fixture
def browser_without_js(browser: Any) -> Iterator[Any]:
    """The module's browser with JavaScript turned off (DevTools' switch) for one test."""
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    yield browser
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})
