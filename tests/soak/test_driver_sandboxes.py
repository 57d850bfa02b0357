"""Found by the soak (seed 11 step 227 in the 6-minute run, seed 11 step 2188 in the 30-minute run):
containerd containers left after every pod was drained.

The kubelet driver's fault, not fgpu's: a RunPodSandbox whose answer is lost (containerd restarted,
the proxy killed mid-call, the client's deadline) may still have made the sandbox. The driver only
knew sandboxes by the id an answer gave it, so that one was never removed, and its name stayed
reserved in containerd, so the pod's later tries failed too. kubelet finds a pod's sandboxes by the
`io.kubernetes.pod.uid` label when it kills the pod and garbage-collects those of pods that are gone;
the driver now does the same (`bench/soak/sandboxes.py`). Real containerd, no proxy in between: the
proxy relays these calls unchanged.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from bench.soak import kubelet, workload
from bench.soak.kubeclient import PODS, Client
from bench.soak.sandboxes import SandboxLister
from bench.soak.stack import Node
from hack.localup import cri, podrun
from hack.localup.stack import Daemon
from tests.containerd.harness import Containerd
from tests.e2e.conftest import _unavailable
from tests.kubeapi.server import KubeAPIServer

pytestmark = pytest.mark.containerd

NODE = "soak-n0"


class Cluster:
    def __init__(self, root: str) -> None:
        self.containerd = Containerd(base_dir=os.path.join(root, "containerd"))
        self.api = KubeAPIServer(graceful_pod_deletion=True)
        unused = Daemon("", [], log_path="", cwd=root)  # no agent or proxy: the driver dials containerd
        self.node = Node(name=NODE, root=root, inventory="", gpus=(), agent=unused, proxy=unused, agent_metrics="")
        self.running: set[str] = set()

    def start(self) -> None:
        self.api.start()
        self.containerd.start()
        self.containerd.import_images()
        # The driver dials its node's proxy socket; here that is containerd itself.
        os.symlink(self.containerd.address.removeprefix("unix://"), self.node.proxy_sock)

    def driver(self) -> kubelet.NodeDriver:
        return kubelet.NodeDriver(self.node, self.api.url, on_running=lambda uid, _: self.running.add(uid))

    def stop(self) -> None:
        self.api.stop()
        self.containerd.cleanup()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    root = tempfile.mkdtemp(prefix="fgpu-soakdrv-", dir="/tmp")
    c = Cluster(root)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _wait(what: str, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.2)


def _bound_pod(step: int) -> dict[str, Any]:
    pod = workload.pod_manifest(step=step, kind="plain", shape=workload.Shape(0, 0))
    pod["spec"].pop("schedulerName")
    pod["spec"]["nodeName"] = NODE
    return pod


def test_a_sandbox_whose_answer_was_lost_is_found_by_uid_and_removed_and_the_pod_still_runs(cluster: Cluster) -> None:
    driver = cluster.driver()
    lister = SandboxLister(cluster.containerd.address)
    real = driver._kubelet.run_pod_sandbox
    lost: list[str] = []

    def answer_lost_once(config: Any) -> str:
        made = real(config)
        if not lost:
            lost.append(made)
            raise cri.CRIError("RunPodSandbox", grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return made

    driver._kubelet.run_pod_sandbox = answer_lost_once  # type: ignore[method-assign]
    client = Client(cluster.api.url)
    driver.start()
    try:
        pod = client.create(PODS.format(ns=workload.NAMESPACE), _bound_pod(1))
        uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
        # The runtime holds the first sandbox's name: a second RunPodSandbox alone is refused forever.
        _wait("the pod runs after its first sandbox's answer was lost", lambda: uid in cluster.running)
        assert lost and lost[0] not in {s.id for s in lister.list({cri.POD_UID_LABEL: uid})}

        client.delete(f"{PODS.format(ns=workload.NAMESPACE)}/{name}", uid=uid)
        _wait("the driver confirms the deletion", lambda: client.get(f"{PODS.format(ns=workload.NAMESPACE)}/{name}") is None)
        assert lister.list({cri.POD_UID_LABEL: uid}) == []
        assert cluster.containerd.ctr("containers", "ls", "-q").split() == []
        assert driver.strays_removed == 1
    finally:
        driver.stop()
        lister.close()


def test_sandboxes_of_pods_that_are_gone_are_garbage_collected_and_other_nodes_are_left_alone(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubelet, "GC_EVERY_S", 0.5)
    lister = SandboxLister(cluster.containerd.address)
    k = cri.Kubelet(cluster.containerd.address)

    def sandbox(node: str, step: int) -> str:
        pod = podrun.prepare(_bound_pod(step))
        pod["metadata"]["labels"][kubelet.NODE_LABEL] = node
        return podrun.start(k, pod, annotations={}, node=node, pods_dir=cluster.node.pods_dir).sandbox_id

    ours, theirs = sandbox(NODE, 2), sandbox("soak-n1", 3)  # no pod in the API names either
    driver = cluster.driver()
    driver.start()
    try:
        _wait("the gone pod's sandbox is collected", lambda: ours not in {s.id for s in lister.list({})})
        assert {s.id for s in lister.list({})} == {theirs}
        assert driver.strays_removed == 1
    finally:
        driver.stop()
        k.close()
        lister.close()
