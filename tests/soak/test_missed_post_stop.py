"""Found by the soak (bench/soak.py --seed 5, faults kill9-agent / gpu-lost restarting an agent):
a GPU pod removed while its node's agent is down leaves its HAMi cache directory behind.

The shipped hook registration fails open for PostStopPodSandbox, so the proxy
stops the sandbox without the agent. The agent's admission sweep releases the
pod's ledger entry later, but `<hamiCacheRoot>/<pod uid>_<container>` is only
ever removed by PostStopPodSandbox (agent/hookserver.py), so it stays forever.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator

import pytest
import yaml

from hack.localup import cri, podrun
from hack.localup.placing import Placement, SchedulerClient
from hack.localup.stack import Paths, Settings, Stack, teardown
from tests.e2e.conftest import INVENTORY, _unavailable, container, pod
from tests.localup.manifests import REPO

pytestmark = pytest.mark.containerd


class QuickSweepStack(Stack):
    """The local stack with the agent's admission sweep shortened from 60 s / 2 m to 1 s / 1 s."""

    def _agent_config(self) -> str:
        path = super()._agent_config()
        with open(path) as f:
            config = yaml.safe_load(f)
        config.update({"admissionSweep": "1s", "admissionSweepGrace": "1s"})
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path


@pytest.fixture
def stack() -> Iterator[Stack]:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    root = tempfile.mkdtemp(prefix="fgpu-soakreg-", dir="/tmp")
    s = QuickSweepStack(Paths(root), Settings(repo=str(REPO), inventory=str(INVENTORY), isolation="hami-core"))
    try:
        s.start()
        yield s
    finally:
        s.stop()
        teardown(root)


def test_a_pod_removed_while_the_agent_is_down_leaves_no_hami_cache_directory(stack: Stack) -> None:
    cache_root = stack.isolation_paths()["hamiCacheRoot"]
    scheduler = SchedulerClient(stack.scheduler_address, bound_pod=stack.bound_pod)
    kubelet = cri.Kubelet(stack.proxy_address)
    try:
        prepared = podrun.prepare(pod("leaky", [container("main", core=30, ratio=30, command=["sleep", "600"])]))
        placed = scheduler.place(prepared)
        assert isinstance(placed, Placement), placed
        run = podrun.start(kubelet, prepared, annotations=placed.annotations, node="fgpu-local",
                           pods_dir=stack.paths.pods_dir)
        podrun.run(kubelet, run, leave_running=True)
        uid = prepared["metadata"]["uid"]
        assert os.path.isdir(os.path.join(cache_root, f"{uid}_main")), os.listdir(cache_root)

        stack.stop_agent()
        podrun.remove(kubelet, run)  # PostStopPodSandbox cannot reach the agent: ignored, as registered
        stack.start_agent()
        scheduler.release(prepared, node="fgpu-local")

        deadline = time.monotonic() + 15  # many sweep periods
        while time.monotonic() < deadline and os.path.exists(os.path.join(cache_root, f"{uid}_main")):
            time.sleep(0.2)
        assert not os.path.exists(os.path.join(cache_root, f"{uid}_main")), (
            f"{cache_root}/{uid}_main outlived its pod: {os.listdir(cache_root)}"
        )
    finally:
        scheduler.close()
        kubelet.close()
