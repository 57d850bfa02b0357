"""Fixtures of the runtime proxy tests: a session containerd, a proxy and a test hook server per test."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from tests.containerd.fixtures import containerd  # noqa: F401 - a fixture
from tests.containerd.harness import Containerd
from tests.runtimeproxy.fakeruntime import FakeRuntime
from tests.runtimeproxy.hookserver import TestHookServer, write_hook_config
from tests.runtimeproxy.rig import ProxyRig

GPU_STAGES = ["PreCreateContainer"]


@pytest.fixture
def hook_server() -> Iterator[TestHookServer]:
    base = tempfile.mkdtemp(prefix="fgpu-hook-", dir="/tmp")
    server = TestHookServer(socket_path=os.path.join(base, "hooks.sock")).start()
    yield server
    server.stop()


@pytest.fixture
def rig(containerd: Containerd) -> Iterator[ProxyRig]:  # noqa: F811 - the fixture above
    """A proxy in front of the session containerd; not started (tests register hooks first)."""
    r = ProxyRig(backend=containerd.address)
    yield r
    r.stop()


@pytest.fixture
def gpu_rig(rig: ProxyRig, hook_server: TestHookServer) -> ProxyRig:
    """A started proxy with the test hook server registered as the GPU agent registers itself:
    PreCreateContainer, failurePolicy Ignore (pods without an allocation run while it is down;
    pods with one are fail-closed whatever the policy)."""
    write_hook_config(rig.hook_dir, name="test-gpu-hook", endpoint=hook_server.endpoint, stages=GPU_STAGES,
                      policy="Ignore")
    return rig.start()


@pytest.fixture
def fake_runtime() -> Iterator[FakeRuntime]:
    base = tempfile.mkdtemp(prefix="fgpu-fakert-", dir="/tmp")
    runtime = FakeRuntime(socket_path=os.path.join(base, "runtime.sock")).start()
    yield runtime
    runtime.stop()


@pytest.fixture
def fake_rig(fake_runtime: FakeRuntime) -> Iterator[ProxyRig]:
    """A proxy in front of the recording fake runtime; not started."""
    r = ProxyRig(backend=fake_runtime.address)
    yield r
    r.stop()
