"""Reclaim counts only new usage samples and decides on a current pod list.

The pure parts (`agent.reclaim_samples.judge`, the two-sample rule of `agent.reclaim.decide`) table-driven;
then the loop as the daemon wires it (the NVML worker's samples through `NodeState`) on
tests/overcommit/test_reclaim_node.py's T4 node, against the API double.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent.fakenvml_inventory import ProcessSpec
from agent.health import HealthTracker
from agent.metrics import AgentMetrics
from agent.nodestate import NodeState
from agent.reclaim import GPUMemory, PodOnGPU, ReclaimMemory, ReclaimPolicy, decide, forget_pressure
from agent.reclaim_loop import ReclaimLoop, sample_max_age_s
from agent.reclaim_samples import LastSample, judge
from agent.usage import GPUUsage
from apis import names
from tests.kubeapi import KubeAPIServer
from tests.overcommit.test_reclaim_node import PODS, Node

GiB = 2**30

# --- which reads count -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last", "seq", "now", "new", "lapsed"),
    [
        (LastSample(), 0, 100.0, True, False),  # the first sample
        (LastSample(seq=3, seen_at=100.0), 4, 101.0, True, False),  # the next one
        (LastSample(seq=3, seen_at=100.0), 3, 104.0, False, False),  # read again: nothing new
        (LastSample(seq=3, seen_at=100.0), 3, 105.5, False, True),  # the worker stopped writing
        (LastSample(seq=3, seen_at=100.0), 4, 105.5, True, True),  # a new one, after a lapse
        (LastSample(seq=3, seen_at=100.0), None, 200.0, True, False),  # unnumbered: taken now
    ],
)
def test_a_read_counts_only_when_its_sample_is_new_and_lapses_when_none_came_for_too_long(
    last: LastSample, seq: int | None, now: float, new: bool, lapsed: bool
) -> None:
    reading = judge(last, seq, now=now, max_age_s=5.0)
    assert (reading.new, reading.lapsed) == (new, lapsed)
    assert reading.last == (LastSample(seq=seq, seen_at=now) if new else last)


def test_the_sample_age_limit_is_three_polls_and_never_under_5s() -> None:
    assert [sample_max_age_s(p) for p in (0.05, 1.0, 10.0)] == [5.0, 5.0, 30.0]


# --- the two-sample rule -----------------------------------------------------------------------------------

BURSTY = PodOnGPU(pod_uid="b", namespace="ml", name="b", burstable=True, priority=0, request_bytes=2 * GiB,
                  limit_bytes=7 * GiB, used_bytes=7 * GiB)
FULL = GPUMemory(uuid="GPU-0", total_bytes=15 * GiB, used_bytes=15 * GiB, pods=(BURSTY,))


def _run(samples: list[tuple[float, list[GPUMemory]]], policy: ReclaimPolicy) -> list[float]:
    """When (sample times) an eviction was chosen over a run of samples."""
    memory, out = ReclaimMemory(), []
    for now, gpus in samples:
        verdict = decide(gpus, policy, memory, now=now)
        memory = verdict.memory
        out += [now for _ in verdict.evictions]
    return out


@pytest.mark.parametrize(
    ("grace", "samples", "evicted_at"),
    [
        (0.0, [(0.0, [FULL])], []),  # one sample is never lasting pressure, whatever the grace
        (0.0, [(0.0, [FULL]), (0.1, [FULL])], [0.1]),
        (5.0, [(0.0, [FULL]), (4.9, [FULL])], []),  # two samples, not spanning the grace
        (5.0, [(0.0, [FULL]), (10.0, [FULL])], [10.0]),  # pollInterval 10s, pressureGrace 5s
        (5.0, [(0.0, [FULL]), (3.0, []), (6.0, [FULL])], []),  # the GPU missing (an error) between: no data
        (5.0, [(0.0, [FULL]), (3.0, []), (6.0, [FULL]), (11.0, [FULL])], [11.0]),  # its grace began at 6
    ],
)
def test_pressure_lasts_only_over_two_samples_spanning_the_grace_with_no_gap_in_the_data(
    grace: float, samples: list[tuple[float, list[GPUMemory]]], evicted_at: list[float]
) -> None:
    assert _run(samples, ReclaimPolicy(pressure_grace_s=grace, cooldown_s=0.0)) == evicted_at


def test_forgetting_pressure_keeps_cooldowns_and_pods_already_chosen() -> None:
    memory = ReclaimMemory(pressure_since={"GPU-0": 1.0}, pressure_samples={"GPU-0": 3},
                           last_eviction={"GPU-0": 2.0}, chosen={"b": 2.0})
    assert forget_pressure(memory) == ReclaimMemory(last_eviction={"GPU-0": 2.0}, chosen={"b": 2.0})


# --- the loop as the daemon wires it ------------------------------------------------------------------------


class CountingKube:
    """The node's Kube client, counting pod listings."""

    def __init__(self, kube: Any) -> None:
        self._kube = kube
        self.lists = 0

    def list_pods_on_node(self, node_name: str) -> list[dict[str, Any]]:
        self.lists += 1
        result: list[dict[str, Any]] = self._kube.list_pods_on_node(node_name)
        return result

    def delete_pod(self, namespace: str, name: str, *, uid: str, grace_period_s: int | None = None) -> None:
        self._kube.delete_pod(namespace, name, uid=uid, grace_period_s=grace_period_s)

    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._kube.create_event(namespace, body)
        return result


class Wired:
    def __init__(self, node: Node, *, max_age_s: float = 5.0) -> None:
        self.node = node
        self.kube = CountingKube(node.kube)
        self.registry = CollectorRegistry()
        self.state = NodeState(node_name="gpu-node-1", health=HealthTracker(), metrics=AgentMetrics())
        self.loop = ReclaimLoop(
            node_name="gpu-node-1", kube=self.kube, keys=node.loop._keys, devices=node.loop._devices,
            usage=self.state.usage, policy=node.loop._policy, registry=self.registry, clock=node.clock,
            sample_max_age_s=max_age_s,
        )

    def sample(self, **gib: float) -> None:
        """The NVML worker's next sample, with the pods' processes using `gib`."""
        self.node.use(**gib)
        self.state.set_usage(tuple(self.node.loop._usage()))

    def failed_sample(self) -> None:
        """A sample in which the GPU did not answer NVML."""
        lost = GPUUsage(uuid=self.node.gpu.uuid, error="nvmlDeviceGetMemoryInfo: GPU is lost")
        sample = self.node.loop._usage()
        self.state.set_usage(tuple(lost if u.uuid == lost.uuid else u for u in sample))

    def cycles(self, seconds: float, *, step: float = 1.0) -> list[str]:
        """Reclaim cycles every `step` over `seconds`; the names of the pods chosen."""
        chosen = []
        for _ in range(round(seconds / step)):
            self.node.clock.t += step
            chosen += [e.pod.name for e in self.loop.cycle().evictions]
        return chosen


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with KubeAPIServer(graceful_pod_deletion=True) as api:
        built = Node(str(tmp_path), api)
        yield built
        built.kube.close()


CALM = {"guaranteed": 6.0, "burst-low": 2.0, "burst-high": 2.0}
SPIKE = {**CALM, "burst-low": 6.5}  # 14.5 of 15 GiB: the guaranteed pod's request at risk


def test_two_spikes_with_only_failed_samples_between_do_not_evict(node: Node) -> None:
    wired = Wired(node)
    wired.sample(**CALM)
    assert wired.cycles(1) == []
    wired.sample(**SPIKE)
    assert wired.cycles(2) == []
    wired.failed_sample()
    assert wired.cycles(3) == []
    wired.sample(**SPIKE)  # 5 s after the first spike, but the failed sample between was no data
    assert wired.cycles(1) == []
    assert node.evicted() == []
    # Pressure that does last, sample after sample, still evicts: its grace began at the second spike.
    for _ in range(5):
        wired.sample(**SPIKE)
        chosen = wired.cycles(1)
    assert chosen == ["burst-low"]


def test_slow_samples_of_real_pressure_evict_after_the_grace(node: Node) -> None:
    # pollInterval 10s, pressureGrace 5s: the daemon's age limit is then 30 s, and every sample shows pressure.
    wired = Wired(node, max_age_s=sample_max_age_s(10.0))
    wired.sample(**SPIKE)
    assert wired.cycles(10) == []  # one sample, read ten times
    wired.sample(**SPIKE)
    assert wired.cycles(1) == ["burst-low"]


def test_a_worker_that_stops_sampling_restarts_the_grace(node: Node) -> None:
    wired = Wired(node)  # samples expected at least every 5 s
    wired.sample(**SPIKE)
    assert wired.cycles(8) == []  # no new sample for 8 s: the data lapsed, the pressure ended
    assert wired.loop.cycle().memory.pressure_since == {}
    wired.sample(**SPIKE)  # the worker is back: this pressure's grace begins now
    assert wired.cycles(1) == []
    wired.sample(**SPIKE)
    assert wired.cycles(4) == []
    wired.sample(**SPIKE)
    assert wired.cycles(1) == ["burst-low"]


def test_a_process_of_a_pod_the_api_does_not_list_asks_for_one_listing_not_one_per_cycle(
    node: Node, tmp_path: Path
) -> None:
    # A process in a pod cgroup whose pod the API does not have (a static pod, a pod gone while its
    # process lingers): it is looked for once, then not again until the regular refresh (10 s).
    uid, pid = "aaaaaaaa-0000-4000-8000-0000000000ff", 199
    os.makedirs(os.path.join(tmp_path, str(pid)))
    with open(os.path.join(tmp_path, str(pid), "cgroup"), "w") as f:
        f.write(f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{pid:064x}.scope\n")
    wired = Wired(node)
    wired.sample(**CALM)
    assert wired.cycles(1) == [] and wired.kube.lists == 1
    procs = [(PODS[n][1], g) for n, g in CALM.items()] + [(pid, 1.0)]
    specs = tuple(ProcessSpec(pid=p, used_memory_bytes=int(g * GiB)) for p, g in procs)
    node.nvml.set_usage(0, memory_used_bytes=sum(s.used_memory_bytes for s in specs), processes=specs)
    for _ in range(6):
        wired.state.set_usage(tuple(node.loop._usage()))
        wired.cycles(1)
    assert wired.kube.lists == 2, "the unknown pod asked for a listing every cycle"


def test_an_eviction_is_decided_again_on_a_fresh_listing_and_costs_one_listing(node: Node) -> None:
    wired = Wired(node)
    wired.sample(**SPIKE)
    assert wired.cycles(1) == [] and wired.kube.lists == 1
    # burst-low, the lowest priority, ends and is gone from the API while the cached listing still has it
    # and NVML still lists its process (its memory on its way back). Deleting it would be refused, and
    # would hold the GPU's next eviction back a whole cooldown.
    node.kube.delete_pod("ml", "burst-low", uid=PODS["burst-low"][0], grace_period_s=1)
    node.api.kubelet_confirm_deletion("ml", "burst-low")
    chosen = []
    for _ in range(5):
        wired.sample(**SPIKE)
        chosen += wired.cycles(1)
    assert "burst-low" not in chosen and chosen, chosen
    assert wired.kube.lists == 2  # the regular one, and one before acting
    assert wired.registry.get_sample_value(
        names.METRIC_RECLAIM_EVICTIONS, {"gpu": node.gpu.uuid, "result": "refused"}
    ) is None


def test_each_sample_written_is_numbered_and_a_lost_nvml_is_a_sample_of_no_gpus(node: Node) -> None:
    wired = Wired(node)
    start = wired.state.usage().seq
    wired.sample(**CALM)
    first = wired.state.usage()
    wired.sample(**CALM)  # the same numbers again: still a new sample
    second = wired.state.usage()
    assert first == second and (first.seq, second.seq) == (start + 1, start + 2)
    wired.state.set_discovery_error("NVML: driver not loaded")
    assert wired.state.usage() == () and wired.state.usage().seq == start + 3
