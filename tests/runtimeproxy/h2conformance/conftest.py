"""Fixtures of the frame-level conformance tests: one proxy process and one hook server for the folder.

Each test gets `proxy` (connect h2 peers through it), `hook` (the test hook
server, its behaviour reset) and `gate` (a hook answer held until the test
opens it). After each test the proxy must still run and must have logged no
unhandled exception; runtime connections the test did not accept are closed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.runtimeproxy.h2conformance.rig import Gate, ProxyProcess
from tests.runtimeproxy.hookserver import HookBehaviour, TestHookServer


@pytest.fixture(scope="session")
def h2_hook() -> Iterator[TestHookServer]:
    base = tempfile.mkdtemp(prefix="fgpu-h2hook-", dir="/tmp")
    server = TestHookServer(socket_path=os.path.join(base, "hooks.sock")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def h2_proxy(h2_hook: TestHookServer) -> Iterator[ProxyProcess]:
    base = tempfile.mkdtemp(prefix="fgpu-h2-", dir="/tmp")
    proxy = ProxyProcess(base, hook_endpoint=h2_hook.endpoint).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def hook(h2_hook: TestHookServer) -> Iterator[TestHookServer]:
    h2_hook.behaviour = HookBehaviour()
    yield h2_hook
    h2_hook.behaviour = HookBehaviour()


@pytest.fixture
def gate(hook: TestHookServer) -> Iterator[Gate]:
    g = Gate()
    hook.behaviour.extra = g
    yield g
    g.open()


@pytest.fixture
def proxy(h2_proxy: ProxyProcess, request: pytest.FixtureRequest) -> Iterator[ProxyProcess]:
    h2_proxy.mark_log()
    yield h2_proxy
    h2_proxy.close_all()
    if request.node.get_closest_marker("xfail") is None:
        problems = h2_proxy.problems()
        assert not problems, problems
