"""fgpu prices the multi-GPU spots a placement takes by how short the cluster is of them."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.demand import demand_of
from scheduler_plugin.core.fragmentation import PodShape, TargetWorkload
from scheduler_plugin.core.policy_fgpu import FGPUPolicy, LumpShapes, lump_pressure
from scheduler_plugin.sim.replay import build_scheduler, place, pod_request
from scheduler_plugin.sim.trace import TracePod
from tests.simulator.helpers import WORKLOAD, node, occupy, pod

#: 8-GPU pods of 120 cores (only a 128-core node takes them), of 88 cores, and 4-GPU pods
BIG_EIGHTS = TargetWorkload(
    shapes=(
        PodShape(cpu_milli=120000, gpu_milli=1000, num_gpu=8),
        PodShape(cpu_milli=88000, gpu_milli=1000, num_gpu=8),
        PodShape(cpu_milli=32000, gpu_milli=1000, num_gpu=4),
        PodShape(cpu_milli=4000, gpu_milli=500, num_gpu=1),
    ),
    weights=(0.2, 0.2, 0.3, 0.3),
)
#: GPU volume per pod: 0.2 x 8000 + 0.2 x 8000 + 0.3 x 4000 + 0.3 x 500; each lump shape's share of it
VOLUME = 4550
EIGHT, FOUR = 1600 / VOLUME, 1200 / VOLUME
NODES = [node("wide", gpus=8, cpu=128000, memory_mib=1 << 20), node("narrow", gpus=8, cpu=96000, memory_mib=1 << 20)]


@pytest.mark.parametrize(
    ("free", "cpu", "allowed", "hosts"),
    [
        # 8 whole GPUs and 128 cores: one of each 8-GPU shape, two 4-GPU pods
        ([1000] * 8, 128000, True, [1, 1, 2]),
        # 96 cores: the 120-core shape no longer fits, GPUs still do
        ([1000] * 8, 96000, True, [0, 1, 2]),
        # one GPU half taken: 7 whole GPUs, one 4-GPU pod
        ([500] + [1000] * 7, 128000, True, [0, 0, 1]),
        # CPU is the limit: 40 cores take one 4-GPU pod of 32
        ([1000] * 8, 40000, True, [0, 0, 1]),
        # a model the shapes may not use hosts none
        ([1000] * 8, 128000, False, [0, 0, 0]),
    ],
)
def test_a_node_hosts_as_many_pods_of_each_multi_gpu_shape_as_its_gpus_and_cpu_allow_together(
    free: list[int], cpu: int, allowed: bool, hosts: list[int]
) -> None:
    lumps = LumpShapes.of(BIG_EIGHTS)
    model_ok = np.full((1, len(BIG_EIGHTS.shapes)), allowed)
    got = lumps.hosts(lumps.counts(np.array([free])), np.array([cpu]), model_ok)
    assert got.tolist() == [hosts]


def test_the_lump_shapes_are_the_multi_gpu_ones_with_their_share_of_the_gpu_volume() -> None:
    lumps = LumpShapes.of(BIG_EIGHTS)
    assert lumps.gpus.tolist() == [8, 8, 4]
    assert lumps.volume_share == pytest.approx([EIGHT, EIGHT, FOUR])
    assert len(LumpShapes.of(WORKLOAD).gpus) == 0


@pytest.mark.parametrize(
    ("hosts", "free_milli", "pressure"),
    [
        # 80 GPUs free: 0.35 x 80 / 8 = 3.5 pods of the 120-core shape to come for 1 spot: short
        # (z = 1.6); 3.5 of the 88-core shape for 10 spots and 5.3 of the 4-GPU one for 20: room to spare
        ([1, 10, 20], 80000, [0.946, 0.0, 0.0]),
        # nowhere to host the 120-core shape: nothing left to lose
        ([0, 10, 20], 80000, [0.0, 0.0, 0.0]),
        # as many pods to come as spots (less the continuity half): even odds
        ([4, 4, 20], 3.5 * 8000 / EIGHT, [0.5, 0.5, 0.0]),
        # a cluster with 1,000 8-GPU pods to come and 1,200 spots for them: not short
        ([1200, 1200, 2400], 1000 * 8000 / EIGHT, [0.0, 0.0, 0.0]),
    ],
)
def test_pressure_is_the_chance_that_the_pods_to_come_outnumber_the_spots_left(
    hosts: list[int], free_milli: float, pressure: list[float]
) -> None:
    lumps = LumpShapes.of(BIG_EIGHTS)
    got = lump_pressure(lumps, hosts=np.array([hosts]), free_milli=free_milli)
    assert got == pytest.approx(pressure, abs=0.01)


@pytest.mark.parametrize(
    "request_pod",
    [
        pod("whole", milli=1000),
        pod("half", milli=500, cpu=2000),
        pod("pair", milli=1000, gpus=2, cpu=8000),
        pod("cpu-only", cpu=12000),
    ],
    ids=lambda p: p.name,
)
def test_without_multi_gpu_shapes_the_term_adds_nothing(request_pod: TracePod) -> None:
    nodes = [*NODES, node("small", gpus=2, cpu=16000)]
    names = [NodeName(n.name) for n in nodes]
    request = pod_request(request_pod)
    on = build_scheduler(nodes, policy="fgpu", seed=0, workload=WORKLOAD)
    off = build_scheduler(nodes, policy="fgpu", seed=0, workload=WORKLOAD, params={"lump_weight": 0})
    assert on.score(request, names) == off.score(request, names)


@pytest.mark.parametrize("seed", range(6))
def test_a_four_gpu_pod_leaves_the_only_node_that_takes_the_widest_pods(seed: int) -> None:
    core = build_scheduler(NODES, policy="fgpu", seed=seed, workload=BIG_EIGHTS)
    assert place(core, pod("four", milli=1000, gpus=4, cpu=32000)) == "narrow"
    assert place(core, pod("widest", milli=1000, gpus=8, cpu=120000)) == "wide"


def test_the_term_costs_more_where_the_spot_taken_is_the_only_one_of_its_shape() -> None:
    # Both nodes lose their 8-GPU spot to a 4-GPU pod, but only the wide one's is the single spot
    # left for the 120-core shape: its pods to come are likelier to outnumber it.
    core = build_scheduler(NODES, policy="fgpu", seed=0, workload=BIG_EIGHTS)
    policy = core.node_policy
    assert isinstance(policy, FGPUPolicy)
    rows = np.array([core.state.slot("wide"), core.state.slot("narrow")], dtype=np.intp)
    four = demand_of(pod_request(pod("four", milli=1000, gpus=4, cpu=32000)))
    wide, narrow = policy.lump_deltas(rows, four, width=1)[:, 0]
    assert wide > narrow > 0
    # A CPU-only pod small enough to leave every spot costs nothing.
    small = demand_of(pod_request(pod("small", cpu=4000)))
    assert policy.lump_deltas(rows, small, width=1).tolist() == [[0.0], [0.0]]


def test_a_share_costs_a_spot_only_on_the_gpus_that_spot_needs_whole() -> None:
    # Five GPUs, the first half used: the other four make the one 4-GPU spot. A share on the half-used
    # GPU leaves it; on any whole GPU it breaks it (the CPU, 64 cores, is ample either way).
    core = build_scheduler([node("five", gpus=5, cpu=64000, memory_mib=1 << 20)], policy="fgpu", seed=0, workload=BIG_EIGHTS)
    occupy(core, "five", [50, 0, 0, 0, 0])
    policy = core.node_policy
    assert isinstance(policy, FGPUPolicy)
    share = demand_of(pod_request(pod("share", milli=300, cpu=1000)))
    row = np.array([core.state.slot("five")], dtype=np.intp)
    cost = policy.lump_deltas(row, share, width=5)[0]
    assert cost[0] == 0.0
    assert cost[1] > 0.0
    assert cost[1:].tolist() == [cost[1]] * 4
