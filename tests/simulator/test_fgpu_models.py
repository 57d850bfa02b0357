"""fgpu and GPU-model constraints: a pod that may run anywhere leaves the GPUs constrained pods need."""

from __future__ import annotations

import pytest

from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.fragmentation import PodShape, TargetWorkload
from scheduler_plugin.core.policy_fgpu import model_pressure
from scheduler_plugin.sim.replay import place, pod_request
from tests.simulator.helpers import cluster, node, pod

#: half the GPU volume may run on T4 only; T4 is half of the cluster below
T4_BOUND = TargetWorkload(
    shapes=(
        PodShape(cpu_milli=1000, gpu_milli=1000, num_gpu=1, models=frozenset({"T4"})),
        PodShape(cpu_milli=1000, gpu_milli=1000, num_gpu=1),
    ),
    weights=(0.5, 0.5),
)
NODES = [node("g2", gpus=4, model="G2"), node("t4", gpus=4, model="T4")]


def test_pressure_is_the_share_of_a_models_gpus_constrained_pods_claim_capped_at_one() -> None:
    light = TargetWorkload(
        shapes=(
            PodShape(cpu_milli=0, gpu_milli=1000, num_gpu=1, models=frozenset({"T4", "G2"})),
            PodShape(cpu_milli=0, gpu_milli=500, num_gpu=1, models=frozenset({"V100"})),
            PodShape(cpu_milli=0, gpu_milli=1000, num_gpu=1),
            PodShape(cpu_milli=0, gpu_milli=0, num_gpu=0),
        ),
        weights=(0.1, 0.2, 0.5, 0.2),
    )
    # GPU volume 0.1 + 0.1 + 0.5 = 0.7 of 20 GPUs: the T4|G2 shape claims 0.1/0.7 x 20 over 10 GPUs.
    pressure = model_pressure(light, {"T4": 2, "G2": 8, "V100": 10, "A10": 0})
    assert pressure["T4"] == pytest.approx(0.1 / 0.7 * 20 / 10)
    assert pressure["G2"] == pytest.approx(pressure["T4"])
    assert pressure["V100"] == pytest.approx(0.1 / 0.7 * 20 / 10)
    assert pressure["A10"] == 0.0
    assert model_pressure(T4_BOUND, {"T4": 2, "G2": 8})["T4"] == 1.0


@pytest.mark.parametrize("seed", range(8))
def test_an_unconstrained_pod_leaves_the_model_constrained_pods_need(seed: int) -> None:
    core = cluster("fgpu", NODES, seed=seed, workload=T4_BOUND)
    assert place(core, pod("free", milli=1000)) == "g2"
    assert place(core, pod("bound", milli=1000, spec=("T4",))) == "t4"


def test_fgpu_scores_the_needed_model_far_below_what_fgd_does() -> None:
    free = pod_request(pod("free", milli=1000))
    names = [NodeName("g2"), NodeName("t4")]
    fgd = dict(cluster("fgd", NODES, workload=T4_BOUND).score(free, names))
    ours = dict(cluster("fgpu", NODES, workload=T4_BOUND).score(free, names))
    assert ours["g2"] == fgd["g2"], "no constrained pod needs G2: nothing added there"
    # The whole GPU is needed by T4-bound pods (pressure 1): hole_weight x 1000 milli, a score of 0.
    assert fgd["t4"] == 50 and ours["t4"] == 0


def test_demands_that_differ_only_in_their_models_are_scored_apart() -> None:
    # Node scores are cached per demand shape, and the models are not part of it: a T4-bound pod
    # scored first must not leave its score (T4 is where it belongs) for a free pod of the same shape.
    core = cluster("fgpu", NODES, workload=T4_BOUND)
    bound = pod_request(pod("bound", milli=1000, spec=("T4",)))
    assert dict(core.score(bound, [NodeName("t4")]))["t4"] == 50
    free = pod_request(pod("free", milli=1000))
    assert dict(core.score(free, [NodeName("g2"), NodeName("t4")]))["t4"] == 0
