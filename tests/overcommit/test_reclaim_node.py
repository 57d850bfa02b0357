"""Reclaim on a node: the fake NVML's processes grow, the agent maps them to pods through cgroups,
reads tiers from the signed allocations in the API double, and evicts through the Eviction API."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from agent.cgroups import PidResolver
from agent.discovery import discover
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import ProcessSpec
from agent.kube import Kube
from agent.pcitopology import InventoryTopology
from agent.reclaim import ReclaimPolicy
from agent.reclaim_loop import ReclaimLoop
from agent.usage import UsageSampler, targets_from
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, ShareLimit
from apis.signing import allocation_annotations
from tests.agent.helpers import T4, started_fake
from tests.kubeapi.server import KubeAPIServer
from tests.signing_keys import signing_key, verifying

KEY = signing_key("cluster-key-for-tests")
NODE = "gpu-node-1"
GiB = 2**30
PODS = {  # name: (uid, pid, priority, request GiB, limit GiB or None)
    "guaranteed": ("aaaaaaaa-0000-4000-8000-000000000001", 101, 1000, 8, None),
    "burst-low": ("aaaaaaaa-0000-4000-8000-000000000002", 102, 0, 2, 7),
    "burst-high": ("aaaaaaaa-0000-4000-8000-000000000003", 103, 100, 2, 5),
}
POLICY = ReclaimPolicy(high_water=0.95, pressure_grace_s=5, cooldown_s=30, eviction_grace_s=30, retry_s=60)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Node:
    """A T4 node: fake NVML, /proc with each pod's process, pods in the API double."""

    def __init__(self, root: str, api: KubeAPIServer) -> None:
        self.nvml: FakeNVML
        self.nvml, inventory = started_fake(T4)
        found = discover(self.nvml, node_name=NODE, topology=InventoryTopology(inventory))
        self.gpu = found.devices.gpus[0]
        self.api = api
        self.clock = Clock()
        for uid, pid, *_ in PODS.values():
            os.makedirs(os.path.join(root, str(pid)))
            with open(os.path.join(root, str(pid), "cgroup"), "w") as f:
                slice_uid = uid.replace("-", "_")
                f.write(f"0::/kubepods.slice/kubepods-pod{slice_uid}.slice/cri-containerd-{pid:064x}.scope\n")
        for name, (uid, _, priority, request, limit) in PODS.items():
            self._create_pod(name, uid, priority, request, limit)
        sampler = UsageSampler(self.nvml, resolver=PidResolver(proc_root=root))
        targets = targets_from(found.handles, gpus=found.devices.gpus)
        self.kube = Kube.connect(kubeconfig=api.kubeconfig_path, request_timeout_s=5.0)
        self.registry = CollectorRegistry()
        self.loop = ReclaimLoop(
            node_name=NODE, kube=self.kube, keys=lambda: verifying(KEY), devices=lambda: found.devices,
            usage=lambda: sampler.sample(targets), policy=POLICY, registry=self.registry, clock=self.clock,
            now=lambda: datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC),
        )

    def _create_pod(self, name: str, uid: str, priority: int, request: int, limit: int | None) -> None:
        share = GPUShare(
            minor=self.gpu.minor, uuid=self.gpu.uuid, core_percent=20, memory_bytes=request * GiB,
            memory_ratio_percent=request * 100 // 15 + 1, containers=(ContainerShare("main", 20, request * GiB, 14),),
            limit=None if limit is None else ShareLimit(60, limit * GiB, limit * 100 // 15 + 1),
        )
        annotations = allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=(share,)))
        self.api.put_object("/api/v1/namespaces/ml/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": annotations},
            "spec": {"nodeName": NODE, "priority": priority, "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": "Running"},
        })

    def use(self, **gib: float) -> None:
        """Sets each named pod's process memory (GiB); a pod left out has no process."""
        procs = tuple(ProcessSpec(pid=PODS[n][1], used_memory_bytes=int(g * GiB)) for n, g in gib.items())
        self.nvml.set_usage(0, memory_used_bytes=sum(p.used_memory_bytes for p in procs), processes=procs)

    def evicted(self) -> list[str]:
        return sorted(
            name for name in PODS
            if (pod := self.api.get_object(f"/api/v1/namespaces/ml/pods/{name}")) is None
            or pod["metadata"].get("deletionTimestamp")
        )

    def events(self) -> list[dict[str, object]]:
        listed = self.kube._call(self.kube._core.list_namespaced_event, namespace="ml")
        return [e for e in json.loads(listed.data)["items"] if e["reason"] == names.EVENT_BURSTABLE_EVICTED]

    def metric(self, result: str) -> float:
        value = self.registry.get_sample_value(
            names.METRIC_RECLAIM_EVICTIONS, {"gpu": self.gpu.uuid, "result": result}
        )
        return value or 0.0


@pytest.fixture
def node(tmp_path: object) -> Iterator[Node]:
    # Graceful deletion: an evicted pod stays, terminating, until its kubelet confirms, as on a real node.
    with KubeAPIServer(graceful_pod_deletion=True) as api:
        built = Node(str(tmp_path), api)
        yield built
        built.kube.close()


def test_growth_of_a_burstable_pod_evicts_the_lowest_priority_burstable_pod_after_the_grace(node: Node) -> None:
    node.use(guaranteed=6, **{"burst-low": 2, "burst-high": 2})
    assert not node.loop.cycle().evictions
    node.use(guaranteed=6, **{"burst-low": 6.5, "burst-high": 2})  # 14.5 of 15 GiB: the guaranteed pod's 2 GiB at risk
    assert not node.loop.cycle().evictions  # pressure starts: the grace runs
    node.clock.t += 4.9
    assert not node.loop.cycle().evictions
    node.clock.t += 0.2
    verdict = node.loop.cycle()
    assert [e.pod.name for e in verdict.evictions] == ["burst-low"]
    assert node.evicted() == ["burst-low"]
    (event,) = node.events()
    assert event["involvedObject"]["name"] == "burst-low"  # type: ignore[index]
    assert "4608 MiB over its request" in str(event["message"])
    assert node.metric("evicted") == 1.0


def test_guaranteed_pods_are_never_evicted_even_when_they_alone_fill_the_gpu(node: Node) -> None:
    node.use(guaranteed=14.9)
    for _ in range(5):
        verdict = node.loop.cycle()
        node.clock.t += 60
        assert not verdict.evictions
    assert verdict.stuck == (node.gpu.uuid,)
    assert node.evicted() == []


def test_cooldown_holds_the_next_eviction_and_recovery_resets_the_grace(node: Node) -> None:
    node.use(guaranteed=6, **{"burst-low": 6.5, "burst-high": 2})
    node.loop.cycle()
    node.clock.t += 5
    assert [e.pod.name for e in node.loop.cycle().evictions] == ["burst-low"]
    # burst-low's process still holds its memory (it is terminating); burst-high grows too.
    node.use(guaranteed=6, **{"burst-low": 6.5, "burst-high": 4.5})
    node.clock.t += 10
    assert not node.loop.cycle().evictions  # cooldown (30 s) since the last eviction on this GPU
    # burst-low's process is gone: 10.5 GiB in use, no pressure, recovered.
    node.api.kubelet_confirm_deletion("ml", "burst-low")
    node.use(guaranteed=6, **{"burst-high": 4.5})
    node.clock.t += 30
    assert not node.loop.cycle().evictions
    assert node.loop.cycle().memory.pressure_since == {}
    # New pressure after recovery waits its own grace, then takes burst-high.
    node.use(guaranteed=7.9, **{"burst-high": 6.9})
    assert not node.loop.cycle().evictions
    node.clock.t += 5
    assert [e.pod.name for e in node.loop.cycle().evictions] == ["burst-high"]
    assert node.evicted() == ["burst-high", "burst-low"]


def test_a_pod_evicted_once_is_not_evicted_again_while_it_terminates(node: Node) -> None:
    node.use(guaranteed=6, **{"burst-low": 6.5, "burst-high": 2})
    node.loop.cycle()
    node.clock.t += 5
    node.loop.cycle()
    node.clock.t += 31  # past the cooldown, burst-low still terminating with its memory
    verdict = node.loop.cycle()
    # The pending eviction covers the deficit already, so nothing more is chosen.
    assert not verdict.evictions
    assert node.metric("evicted") == 1.0


@pytest.mark.parametrize(("own", "given"), [(None, 30), (10, 10), (10**9, 30), (0, 1)])
def test_an_evicted_pod_gets_its_own_grace_capped_by_the_pools_and_never_a_force_delete(
    node: Node, own: int | None, given: int
) -> None:
    if own is not None:
        pod = node.api.get_object("/api/v1/namespaces/ml/pods/burst-low")
        assert pod is not None
        pod["spec"]["terminationGracePeriodSeconds"] = own
        node.api.put_object("/api/v1/namespaces/ml/pods", pod)
    node.use(guaranteed=6, **{"burst-low": 6.5, "burst-high": 2})
    node.loop.cycle()
    node.clock.t += 5
    assert [e.pod.name for e in node.loop.cycle().evictions] == ["burst-low"]
    victim = node.api.get_object("/api/v1/namespaces/ml/pods/burst-low")
    assert victim is not None, "a force delete: the pod object went before its processes"
    assert int(victim["metadata"]["deletionGracePeriodSeconds"]) == given
