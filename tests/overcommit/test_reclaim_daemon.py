"""Reclaim in the running agent: `Agent` with an `overcommit:` settings file, the fake NVML polled by its
own worker, pods in the API double. Scripted memory growth of a burstable pod ends in its deletion, with
no call into the reclaim loop from the test; the settings file is re-read while the agent runs."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from agent.config import AgentConfig, parse_config
from agent.daemon import Agent
from agent.errors import ConfigError
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import ProcessSpec, load_inventory
from agent.kube import Kube
from agent.pcitopology import InventoryTopology
from agent.reclaim import ReclaimPolicy
from agent.reclaim_loop import ReclaimLoop
from agent.reclaim_service import NoReclaim, ReclaimService
from agent.reclaim_settings import SettingsFile
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, ShareLimit
from apis.devices import NodeDevices
from apis.signing import allocation_annotations
from tests.agent.helpers import T4
from tests.kubeapi import DEVICE_CRD
from tests.kubeapi.server import KubeAPIServer
from tests.signing_keys import signing_key, verifying, write_verifying_keys
from tests.waiting import wait_until as _wait

KEY = signing_key("reclaim-daemon-test-key")
NODE = "gpu-node-1"
GiB = 2**30
PODS = {  # name: (uid, pid, request GiB, limit GiB or None)
    "guaranteed": ("bbbbbbbb-0000-4000-8000-000000000001", 201, 8, None),
    "burstable": ("bbbbbbbb-0000-4000-8000-000000000002", 202, 2, 7),
}
SETTINGS = "ratio: 1.5\nhighWater: 0.95\npressureGrace: 300ms\ncooldown: 30s\nevictionGrace: 5s\ninterval: 50ms\n"



@dataclass
class Running:
    agent: Agent
    nvml: FakeNVML
    api: KubeAPIServer
    settings: str

    def use(self, **gib: float) -> None:
        procs = tuple(ProcessSpec(pid=PODS[n][1], used_memory_bytes=int(g * GiB)) for n, g in gib.items())
        self.nvml.set_usage(0, memory_used_bytes=sum(p.used_memory_bytes for p in procs), processes=procs)

    def deleting(self, name: str) -> bool:
        pod = self.api.get_object(f"/api/v1/namespaces/ml/pods/{name}")
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    def ratio_label(self) -> str | None:
        node = self.api.get_object(f"/api/v1/nodes/{NODE}") or {}
        return ((node.get("metadata") or {}).get("labels") or {}).get(names.NODE_BURSTABLE_RATIO)

    def write_settings(self, text: str) -> None:
        with open(self.settings, "w", encoding="utf-8") as f:
            f.write(text)
        stamp = time.time() + 5  # a new mtime even within the filesystem's timestamp granularity
        os.utime(self.settings, (stamp, stamp))


def _pod(api: KubeAPIServer, gpu_uuid: str, name: str) -> None:
    uid, _, request, limit = PODS[name]
    share = GPUShare(
        minor=0, uuid=gpu_uuid, core_percent=20, memory_bytes=request * GiB, memory_ratio_percent=request * 100 // 15 + 1,
        containers=(ContainerShare("main", 20, request * GiB, 14),),
        limit=None if limit is None else ShareLimit(60, limit * GiB, limit * 100 // 15 + 1),
    )
    annotations = allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=(share,)))
    api.put_object("/api/v1/namespaces/ml/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Running"},
    })


@pytest.fixture
def running(tmp_path: object) -> Iterator[Running]:
    tmp = str(tmp_path)
    for uid, pid, *_ in PODS.values():
        os.makedirs(os.path.join(tmp, "proc", str(pid)))
        with open(os.path.join(tmp, "proc", str(pid), "cgroup"), "w", encoding="utf-8") as f:
            f.write(f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{pid:064x}.scope\n")
    settings = os.path.join(tmp, "overcommit.yaml")
    with open(settings, "w", encoding="utf-8") as f:
        f.write(SETTINGS)
    inventory = load_inventory(T4)
    nvml = FakeNVML(inventory)
    with KubeAPIServer(graceful_pod_deletion=True) as api:
        api.install_crd(DEVICE_CRD)
        api.put_object("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        config = AgentConfig(
            node_name=NODE, hook_listen=f"unix://{tmp}/hooks.sock",
            verifying_keys=write_verifying_keys(os.path.join(tmp, "keys"), KEY), metrics_listen="",
            poll_interval_s=0.05, discovery_interval_s=5.0, report_resync_s=5.0,
            checkpoint_path=os.path.join(tmp, "no-checkpoint"), proc_root=os.path.join(tmp, "proc"),
            overcommit=settings,
        )
        agent = Agent(config, node_name=NODE, nvml=nvml, topology=InventoryTopology(inventory),
                      kube=Kube.connect(kubeconfig=api.kubeconfig_path, request_timeout_s=2.0))
        for name in PODS:
            _pod(api, inventory.gpus[0].uuid, name)
        agent.start()
        try:
            yield Running(agent, nvml, api, settings)
        finally:
            agent.stop(2)


def test_memory_growth_of_a_burstable_pod_ends_in_its_deletion_by_the_running_agent(running: Running) -> None:
    running.use(guaranteed=6, burstable=2)
    _wait(lambda: running.ratio_label() == "1.5")  # the pool's ratio, published for the scheduler
    reclaim = running.agent.reclaim
    assert reclaim is not None
    passes = reclaim.passes
    _wait(lambda: reclaim.passes > passes + 5)
    assert not running.deleting("burstable")
    grown = time.monotonic()
    running.use(guaranteed=7.5, burstable=6.9)  # 14.4 of 15 GiB: past the 95% mark
    _wait(lambda: running.deleting("burstable"))
    assert time.monotonic() - grown >= 0.3  # not before the pressure grace
    pod = running.api.get_object("/api/v1/namespaces/ml/pods/burstable")
    assert pod is not None and pod["metadata"]["deletionGracePeriodSeconds"] == 5
    assert not running.deleting("guaranteed")
    registry = running.agent.metrics.registry
    gpu = running.agent.state.devices().gpus[0].uuid
    # Counted right after the delete answers: the test may see the deletion first.
    _wait(lambda: registry.get_sample_value(names.METRIC_RECLAIM_EVICTIONS, {"gpu": gpu, "result": "evicted"}) == 1.0)


def test_guaranteed_pods_alone_over_the_mark_are_never_deleted(running: Running) -> None:
    running.use(guaranteed=14.8)
    reclaim = running.agent.reclaim
    assert reclaim is not None
    passes = reclaim.passes
    _wait(lambda: reclaim.passes > passes + 12)  # well past the grace
    assert not running.deleting("guaranteed")


def test_the_settings_file_is_reread_and_a_bad_one_keeps_the_last_good_settings(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    _wait(lambda: running.ratio_label() == "1.5")
    running.write_settings(SETTINGS.replace("ratio: 1.5", "ratio: 2"))
    _wait(lambda: running.ratio_label() == "2")
    with caplog.at_level(logging.ERROR, logger="agent.reclaim_service"):
        running.write_settings("ratio: 20\n")
        _wait(lambda: "ratio=20: expected a number from 1 to 10" in caplog.text)
    assert "keeping the settings in force" in caplog.text
    assert running.ratio_label() == "2"


def test_the_agent_config_names_the_settings_file_by_an_absolute_path() -> None:
    assert parse_config({"overcommit": "/etc/fgpu/overcommit/overcommit.yaml"}).overcommit.endswith("overcommit.yaml")
    with pytest.raises(ConfigError, match=r"overcommit='overcommit\.yaml' must be an absolute path"):
        parse_config({"overcommit": "overcommit.yaml"})


def _labelled_node(api: KubeAPIServer) -> None:
    api.put_object("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": NODE, "labels": {names.NODE_BURSTABLE_RATIO: "1.5", "keep": "me"}}})


def _labels(api: KubeAPIServer) -> dict[str, str]:
    node = api.get_object(f"/api/v1/nodes/{NODE}") or {}
    return dict((node.get("metadata") or {}).get("labels") or {})


def test_an_agent_without_reclaim_removes_the_ratio_label_even_when_the_api_fails_at_first() -> None:
    with KubeAPIServer() as api:
        _labelled_node(api)
        kube = Kube.connect(kubeconfig=api.kubeconfig_path, request_timeout_s=2.0)
        api.fail_next(3, status=503, path_contains=f"/nodes/{NODE}")
        remover = NoReclaim(node_name=NODE, labels=kube, retry_s=0.02)
        remover.start()
        try:
            assert remover.done.wait(10)
        finally:
            remover.stop(2)
            kube.close()
        assert _labels(api) == {"keep": "me"}


def test_an_agent_whose_settings_never_read_cleanly_takes_no_burstable_pods(tmp_path: object) -> None:
    with KubeAPIServer() as api:
        _labelled_node(api)
        kube = Kube.connect(kubeconfig=api.kubeconfig_path, request_timeout_s=2.0)
        bad = os.path.join(str(tmp_path), "overcommit.yaml")
        with open(bad, "w", encoding="utf-8") as f:
            f.write("ratio: 20\n")
        loop = ReclaimLoop(node_name=NODE, kube=kube, keys=lambda: verifying(KEY),
                           devices=lambda: NodeDevices(node_name=NODE), usage=lambda: (),
                           policy=ReclaimPolicy(), registry=CollectorRegistry())
        service = ReclaimService(settings=SettingsFile(bad), loop=loop, node_name=NODE, isolation="hami-core",
                                 labels=kube)
        try:
            service.step()
            assert names.NODE_BURSTABLE_RATIO not in _labels(api)  # no reclaim runs: no burstable pods either
            with open(bad, "w", encoding="utf-8") as f:
                f.write("ratio: 2\n")
            os.utime(bad, (time.time() + 5, time.time() + 5))
            service.step()
            assert _labels(api)[names.NODE_BURSTABLE_RATIO] == "2"
        finally:
            kube.close()
