"""fgpu's look-ahead terms speak for the single-GPU part of the workload only."""

from __future__ import annotations

import pytest

from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.fragmentation import PodShape, TargetWorkload
from scheduler_plugin.core.policy_fgpu import single_gpu_volume
from scheduler_plugin.sim.replay import build_scheduler, pod_request
from tests.simulator.helpers import WORKLOAD, cluster, node, pod

EIGHTS = TargetWorkload(
    shapes=(
        PodShape(cpu_milli=88000, gpu_milli=1000, num_gpu=8),
        PodShape(cpu_milli=12000, gpu_milli=0, num_gpu=0),
    ),
    weights=(0.5, 0.5),
)
MIXED = TargetWorkload(
    shapes=(
        PodShape(cpu_milli=64000, gpu_milli=1000, num_gpu=8),
        PodShape(cpu_milli=4000, gpu_milli=500, num_gpu=1),
        PodShape(cpu_milli=4000, gpu_milli=1000, num_gpu=1),
    ),
    weights=(0.1, 0.6, 0.3),
)


def test_the_single_gpu_volume_share_weighs_shapes_by_gpu_volume() -> None:
    assert single_gpu_volume(WORKLOAD) == 1.0
    assert single_gpu_volume(EIGHTS) == 0.0
    # 0.6 x 500 + 0.3 x 1000 = 600 single-GPU milli against 0.1 x 8000 = 800 in 8-GPU pods.
    assert single_gpu_volume(MIXED) == pytest.approx(600 / 1400)


@pytest.mark.parametrize("seed", range(4))
def test_with_only_multi_gpu_pods_fgpu_scores_as_fgd_plus_the_spots_taken(seed: int) -> None:
    # A CPU-rich 2-GPU node and an empty 8-GPU node: stranding at full weight would send the
    # CPU-only pod to the 8-GPU node (its CPU looks ample per GPU on average), breaking it for
    # the 88-core 8-GPU pods; FGD's per-shape test sees that, and the spot term (the only
    # look-ahead left at single-GPU share 0) only adds to the 8-GPU node's cost.
    nodes = [node("eight", gpus=8, cpu=96000, memory_mib=1 << 20), node("two", gpus=2, cpu=24000, memory_mib=1 << 20)]
    names = [NodeName("eight"), NodeName("two")]
    request = pod_request(pod("cpu-only", cpu=12000))
    fgd = cluster("fgd", nodes, seed=seed, workload=EIGHTS).score(request, names)
    no_spots = build_scheduler(nodes, policy="fgpu", seed=seed, workload=EIGHTS, params={"lump_weight": 0})
    assert no_spots.score(request, names) == fgd
    ours = dict(cluster("fgpu", nodes, seed=seed, workload=EIGHTS).score(request, names))
    two, eight = NodeName("two"), NodeName("eight")
    assert ours[two] == dict(fgd)[two]
    assert ours[eight] <= dict(fgd)[eight] < ours[two]
