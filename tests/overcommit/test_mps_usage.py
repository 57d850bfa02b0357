"""Under MPS a client's memory is listed by nvmlDeviceGetMPSComputeRunningProcesses, not necessarily by the
compute list: the usage cycle reads both, so reclaim sees the memory of pods whose processes are MPS clients."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agent.cgroups import PidResolver
from agent.discovery import discover
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import ProcessSpec
from agent.pcitopology import InventoryTopology
from agent.usage import SampleTarget, UsageSampler, targets_from
from tests.agent.helpers import T4, started_fake
from tests.kubeapi.server import KubeAPIServer
from tests.overcommit.test_reclaim_node import PODS, Node

GiB = 2**30
UID = "dddddddd-0000-4000-8000-000000000001"


def _sampler(root: str) -> tuple[UsageSampler, FakeNVML, tuple[SampleTarget, ...]]:
    os.makedirs(os.path.join(root, "300"))
    with open(os.path.join(root, "300", "cgroup"), "w", encoding="utf-8") as f:
        f.write(f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{300:064x}.scope\n")
    nvml, inventory = started_fake(T4)
    found = discover(nvml, node_name="n", topology=InventoryTopology(inventory))
    targets = targets_from(found.handles, gpus=found.devices.gpus)
    return UsageSampler(nvml, resolver=PidResolver(proc_root=root)), nvml, targets


def test_a_process_listed_only_as_an_mps_client_is_mapped_to_its_pod(tmp_path: object) -> None:
    sampler, nvml, targets = _sampler(str(tmp_path))
    # The compute list holds the MPS server (a host process here); the pod's client is in the MPS list only.
    nvml.set_usage(0, memory_used_bytes=5 * GiB, processes=(ProcessSpec(pid=1, used_memory_bytes=GiB),),
                   mps_processes=(ProcessSpec(pid=300, used_memory_bytes=4 * GiB),))
    gpu0 = sampler.sample(targets)[0]
    assert sorted((p.pid, p.pod_uid, p.used_memory_bytes) for p in gpu0.processes) == [
        (1, "", GiB), (300, UID, 4 * GiB),
    ]


def test_a_process_in_both_lists_counts_once(tmp_path: object) -> None:
    sampler, nvml, targets = _sampler(str(tmp_path))
    client = ProcessSpec(pid=300, used_memory_bytes=4 * GiB)
    nvml.set_usage(0, memory_used_bytes=4 * GiB, processes=(client,), mps_processes=(client,))
    gpu0 = sampler.sample(targets)[0]
    assert [(p.pid, p.used_memory_bytes) for p in gpu0.processes] == [(300, 4 * GiB)]


def test_a_driver_without_the_mps_listing_is_asked_once_and_the_compute_list_still_read(tmp_path: object) -> None:
    sampler, nvml, targets = _sampler(str(tmp_path))
    nvml.mps_listing = False
    nvml.set_usage(0, processes=(ProcessSpec(pid=300, used_memory_bytes=GiB),))
    for _ in range(3):
        gpu0 = sampler.sample(targets)[0]
        assert [(p.pid, p.pod_uid) for p in gpu0.processes] == [(300, UID)] and not gpu0.error
    gpus = len(targets)
    assert nvml.calls["nvmlDeviceGetMPSComputeRunningProcesses"] == gpus
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses"] == 3 * gpus


@pytest.fixture
def node(tmp_path: object) -> Iterator[Node]:
    with KubeAPIServer(graceful_pod_deletion=True) as api:
        built = Node(str(tmp_path), api)
        yield built
        built.kube.close()


def test_reclaim_evicts_a_burstable_pod_whose_memory_is_held_by_mps_clients(node: Node) -> None:
    def use(**gib: float) -> None:
        procs = tuple(ProcessSpec(pid=PODS[n][1], used_memory_bytes=int(g * GiB)) for n, g in gib.items())
        node.nvml.set_usage(0, memory_used_bytes=sum(p.used_memory_bytes for p in procs), processes=(),
                            mps_processes=procs)

    use(guaranteed=6, **{"burst-low": 6.5, "burst-high": 2})  # the guaranteed pod's request at risk
    node.loop.cycle()
    node.clock.t += 5
    assert [e.pod.name for e in node.loop.cycle().evictions] == ["burst-low"]
    assert node.evicted() == ["burst-low"]
