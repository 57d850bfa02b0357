"""Held-out review of fgpu's pod-moving parts: the defragmenting descheduler and overcommit reclaim.

Each test shows one defect through the production path (the official kubernetes client against the
API double `tests/kubeapi`, the fake NVML, real cgroup lookups), marked `xfail(strict=True)` while
the defect stands, so the suite stays green until it is fixed and then guards the fix.

Descheduler clusters are the ones tests/review/test_descheduler_review.py builds (three 1-GPU
nodes: n1 two 20 % shares of ReplicaSet `web`, n2 two 30 % shares of ReplicaSet `db`, both in the
opted-in namespace `prod`; n3 a bare 50 % pod; a whole-GPU pod `tenant/train` pending), here on an
API double with graceful pod deletion: an evicted or deleted pod stays, terminating, until its
kubelet confirms, as on a real cluster. Reclaim nodes are tests/overcommit/test_reclaim_node.py's
T4 node (one guaranteed pod, two burstable ones, processes mapped to pods through /proc cgroups).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
from prometheus_client import CollectorRegistry

from agent.fakenvml_inventory import ProcessSpec
from agent.health import HealthTracker
from agent.metrics import AgentMetrics
from agent.nodestate import NodeState
from agent.reclaim_loop import ReclaimLoop
from apis import names
from scheduler_plugin.descheduler import safety
from scheduler_plugin.descheduler.controller import Controller, Stats
from scheduler_plugin.descheduler.evictor import Evictor, Limits
from scheduler_plugin.descheduler.kube import DeschedulerKube
from tests.kubeapi import KubeAPIServer
from tests.overcommit.test_reclaim_node import PODS, GiB, Node
from tests.review.test_descheduler_review import (
    NOW,
    TENANT,
    VICTIMS,
    _cluster,
    _leaving,
    _owned_pod,
    _pending,
)

# --- the descheduler ---------------------------------------------------------------------------------------


@pytest.fixture
def graceful_api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer(graceful_pod_deletion=True) as api:
        yield api


@pytest.fixture
def dkube(graceful_api: KubeAPIServer) -> Iterator[DeschedulerKube]:
    api_client = kubernetes.config.new_client_from_config(config_file=graceful_api.kubeconfig_path)  # type: ignore[no-untyped-call]
    connected = DeschedulerKube(api_client)
    yield connected
    connected.close()


def test_no_second_plan_for_a_pending_pod_while_the_pods_moved_for_it_still_terminate(
    graceful_api: KubeAPIServer, dkube: DeschedulerKube
) -> None:
    _cluster(graceful_api)
    _pending(graceful_api)
    controller = Controller(dkube, Evictor(dkube, Limits(dry_run=False)), NOW)
    first = controller.cycle(Stats())
    assert first.startswith(f"made room for {TENANT}/train"), first
    moved = _leaving(graceful_api)
    assert len(moved) == 2, moved  # one node's two shares, evicted and shutting down (their grace)

    # The next cycle (60 s later by default) comes while they still shut down: their room is on its
    # way to `train`, which is therefore still pending, as it must be until they are gone.
    second = controller.cycle(Stats())

    assert _leaving(graceful_api) == moved, (
        f"more of prod's pods were evicted for the same pending pod: {second}"
    )


def test_no_pods_are_moved_for_a_pending_pod_whose_room_is_already_being_freed(
    graceful_api: KubeAPIServer, dkube: DeschedulerKube
) -> None:
    _cluster(graceful_api)
    # kube-scheduler's preemption (or the bare pod's owner) deletes the pod on n3; it shuts down
    # within its grace, and the scheduler nominated n3 for `train`, which fits n3 once it is gone.
    dkube.evict_pod(VICTIMS, "bare")
    bare = graceful_api.get_object(f"/api/v1/namespaces/{VICTIMS}/pods/bare")
    assert bare is not None and bare["metadata"].get("deletionTimestamp")
    _pending(graceful_api, status={"phase": "Pending", "nominatedNodeName": "n3"})
    controller = Controller(dkube, Evictor(dkube, Limits(dry_run=False)), NOW)

    line = controller.cycle(Stats())

    assert _leaving(graceful_api) == set(), f"pods were evicted for room that was already coming: {line}"


def test_a_pod_that_says_no_on_its_own_label_is_not_moved_in_an_opted_in_namespace() -> None:
    pod = _owned_pod("ReplicaSet", "apps/v1")
    pod["metadata"]["labels"] = {names.DEFRAG_OPT_IN_LABEL: "deny"}  # its owner's explicit word

    reason = safety.why_not_movable(pod, {names.DEFRAG_OPT_IN_LABEL: names.DEFRAG_OPT_IN_VALUE})

    assert reason, "the namespace's opt-in overrode the pod's own fgpu.io/defrag=deny"


# --- overcommit reclaim ------------------------------------------------------------------------------------


@pytest.fixture
def reclaim_node(tmp_path: object) -> Iterator[Node]:
    with KubeAPIServer(graceful_pod_deletion=True) as api:
        built = Node(str(tmp_path), api)
        yield built
        built.kube.close()


def test_one_bad_nvml_sample_does_not_evict_a_pod_however_long_it_is_the_latest(reclaim_node: Node) -> None:
    node = reclaim_node
    # As the daemon wires it: the NVML worker writes each sample into NodeState, reclaim reads the latest.
    state = NodeState(node_name="gpu-node-1", health=HealthTracker(), metrics=AgentMetrics())
    sample = node.loop._usage
    loop = ReclaimLoop(
        node_name="gpu-node-1", kube=node.kube, keys=node.loop._keys, devices=node.loop._devices,
        usage=state.usage, policy=node.loop._policy, registry=CollectorRegistry(), clock=node.clock,
    )
    node.use(guaranteed=6, **{"burst-low": 2, "burst-high": 2})
    state.set_usage(tuple(sample()))
    assert not loop.cycle().evictions
    # One glitched sample (a spike, or NVML misreading a process), then the worker's next sample comes
    # 10 s later (`pollInterval: 10s`, or an NVML call that hangs for a while), reclaim reads every 1 s.
    node.use(guaranteed=6, **{"burst-low": 6.5, "burst-high": 2})
    state.set_usage(tuple(sample()))
    for _ in range(9):
        node.clock.t += 1
        loop.cycle()
    node.use(guaranteed=6, **{"burst-low": 2, "burst-high": 2})  # the next real sample: all is well
    state.set_usage(tuple(sample()))
    node.clock.t += 1
    loop.cycle()

    assert node.evicted() == [], "a pod was evicted on the strength of one NVML sample"


def test_the_burstable_pod_that_just_started_and_overuses_is_the_one_evicted(reclaim_node: Node, tmp_path: Path) -> None:
    node = reclaim_node
    node.use(guaranteed=6, **{"burst-low": 2, "burst-high": 1})
    assert not node.loop.cycle().evictions  # the agent lists the node's pods now (reused for 10 s)

    # A new burstable pod (priority 0 like burst-low, request 1 GiB, limit 7 GiB) is bound and starts;
    # its process is mapped to it through its cgroup, as any pod's.
    uid, pid = "aaaaaaaa-0000-4000-8000-000000000004", 104
    os.makedirs(os.path.join(tmp_path, str(pid)))
    with open(os.path.join(tmp_path, str(pid), "cgroup"), "w") as f:
        f.write(f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{pid:064x}.scope\n")
    node._create_pod("newcomer", uid, 0, 1, 7)
    # It grows to 5 GiB (4 GiB over its request): the GPU is past its mark (14.5 of 15 GiB).
    used = {PODS["guaranteed"][1]: 6.0, PODS["burst-low"][1]: 2.5, PODS["burst-high"][1]: 1.0, pid: 5.0}
    procs = tuple(ProcessSpec(pid=p, used_memory_bytes=int(g * GiB)) for p, g in used.items())
    node.nvml.set_usage(0, memory_used_bytes=sum(p.used_memory_bytes for p in procs), processes=procs)
    node.clock.t += 1
    assert not node.loop.cycle().evictions  # pressure begins; the grace runs
    node.clock.t += 5.1
    verdict = node.loop.cycle()

    # Lowest priority first (a tie: burst-low and newcomer are both 0), then the largest overuse:
    # newcomer (4 GiB over) before burst-low (0.5 GiB over), and newcomer alone covers the deficit.
    assert [e.pod.name for e in verdict.evictions] == ["newcomer"], (
        f"evicted {[e.pod.name for e in verdict.evictions]}: the overusing pod was not on the agent's stale pod list"
    )
    pod = node.api.get_object("/api/v1/namespaces/ml/pods/burst-low")
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")

