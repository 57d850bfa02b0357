"""The fgpu policy's two look-ahead terms: stranded GPU and the eventual waste of holes."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import Demand
from scheduler_plugin.core.fragmentation import HoleWaste, PodShape, TargetWorkload
from scheduler_plugin.core.policies import PolicyContext, make_policy
from scheduler_plugin.core.policy_fgpu import FGPUPolicy, ResourceRatios
from scheduler_plugin.sim.replay import place
from tests.simulator.helpers import WORKLOAD, cluster, gpus_of, node, occupy, pod


@pytest.mark.parametrize("seed", range(6))
def test_a_cpu_heavy_pod_goes_where_its_cpu_strands_no_gpu(seed: int) -> None:
    # WORKLOAD's GPU pods ask 4 CPU milli per milli-GPU: "dense" has exactly that, "rich" 4x more.
    nodes = [node("dense", gpus=8, cpu=32000), node("rich", gpus=2, cpu=32000)]
    core = cluster("fgpu", nodes, seed=seed)
    assert place(core, pod("cpu-heavy", cpu=8000)) == "rich"


def test_fgd_does_not_see_the_stranding_coming() -> None:
    # The same cluster under fgd: no shape stops fitting, so every node ties and the node order decides.
    chosen = {
        place(cluster("fgd", [node("dense", gpus=8, cpu=32000), node("rich", gpus=2, cpu=32000)], seed=s), pod("c", cpu=8000))
        for s in range(12)
    }
    assert chosen == {"dense", "rich"}


def test_a_share_prefers_the_hole_the_workload_will_fill_over_one_it_never_fills() -> None:
    workload = TargetWorkload(
        shapes=(PodShape(cpu_milli=0, gpu_milli=470, num_gpu=1), PodShape(cpu_milli=0, gpu_milli=1000, num_gpu=1)),
        weights=(0.5, 0.5),
    )
    core = cluster("fgpu", [node("a", gpus=2)], workload=workload)
    # GPU 0 has 500 free, GPU 1 has 700 free. A 200 share leaves 300 (nothing fills it) or
    # 500 (a 470 pod will): fgpu takes GPU 1 although GPU 0 is tighter.
    occupy(core, "a", [50, 30])
    share = pod("share", milli=200, cpu=0)
    assert place(core, share) == "a"
    assert gpus_of(core, share) == ("a", (1,))


def test_hole_waste_follows_the_greedy_fill_of_the_workload() -> None:
    workload = TargetWorkload(shapes=(PodShape(cpu_milli=1000, gpu_milli=470, num_gpu=1),), weights=(1.0,))
    holes = HoleWaste(workload)
    ids = holes.table_ids(model_ok=np.ones((2, 1), dtype=np.bool_), cpu_free=np.array([8000, 500]))
    table = holes.table
    assert table[ids[0], 53] == pytest.approx(60)  # 530 -> one 470 -> 60 left
    assert table[ids[0], 100] == pytest.approx(60)  # 1000 -> 530 -> 60
    assert table[ids[0], 19] == pytest.approx(190)  # nothing fits 190
    assert table[ids[1], 100] == pytest.approx(1000)  # CPU short: no pod ever comes
    assert holes.node_waste(np.array([[530, 190], [1000, 0]]), ids).tolist() == pytest.approx([250, 1000])


def test_a_hole_only_a_rare_shape_fits_is_filled_in_proportion_to_that_shape_s_supply() -> None:
    workload = TargetWorkload(
        shapes=(PodShape(cpu_milli=0, gpu_milli=470, num_gpu=1), PodShape(cpu_milli=0, gpu_milli=160, num_gpu=1)),
        weights=(0.99, 0.01),
    )
    everywhere = np.ones((1, 2), dtype=np.bool_), np.array([8000])
    always = HoleWaste(workload)
    scarce = HoleWaste(workload, fill_supply=0.04)
    ids_always = always.table_ids(model_ok=everywhere[0], cpu_free=everywhere[1])
    ids_scarce = scarce.table_ids(model_ok=everywhere[0], cpu_free=everywhere[1])
    # 190: only the 1% shape fits; a supply of 4% fills it a quarter of the time (190 -> 30).
    assert always.table[ids_always[0], 19] == pytest.approx(30)
    assert scarce.table[ids_scarce[0], 19] == pytest.approx(0.25 * 30 + 0.75 * 190)
    # 530: the common 470 fits, so it is filled as surely as before.
    assert scarce.table[ids_scarce[0], 53] == pytest.approx(0.99 * 60 + 0.01 * scarce.table[ids_scarce[0], 37])


def test_pinned_ratios_override_the_workload_s() -> None:
    pinned = {"cpu_per_gpu_milli": 2.5, "memory_per_gpu_milli": 0.0}
    policy = make_policy("fgpu", context=PolicyContext(state=ClusterState(), params=pinned, options={"workload": WORKLOAD}))
    assert isinstance(policy, FGPUPolicy)
    assert policy.ratios == ResourceRatios(cpu=2.5, memory=0.0)


def test_without_a_workload_the_ratios_come_with_the_learnt_one() -> None:
    policy = make_policy("fgpu", context=PolicyContext(state=ClusterState()))
    assert isinstance(policy, FGPUPolicy)
    assert policy.ratios.cpu == 0  # the stand-in asks no CPU: nothing is stranded yet
    learnt = TargetWorkload(shapes=(PodShape(cpu_milli=5000, gpu_milli=500, num_gpu=1),), weights=(1.0,), memory_per_gpu_milli=20.0)
    policy.workload_changed(learnt)
    assert policy.ratios == ResourceRatios(cpu=10.0, memory=20.0)


def test_fgpu_rejects_unknown_parameters() -> None:
    with pytest.raises(ValueError, match="unknown parameter\\(s\\) bogus"):
        make_policy("fgpu", context=PolicyContext(state=ClusterState(), params={"bogus": 1.0}))


def test_fgpu_takes_its_ratios_from_the_target_workload() -> None:
    policy = make_policy("fgpu", context=PolicyContext(state=ClusterState(), options={"workload": WORKLOAD}))
    assert isinstance(policy, FGPUPolicy)
    assert policy.ratios.cpu == pytest.approx(4.0)


def test_steered_hole_waste_expects_a_hole_to_go_to_the_pod_that_fills_it_best() -> None:
    # 470 pods are three times as frequent as 650 pods. Unsteered, a 680 hole most likely gets a
    # 470 (210 left, which nothing fills); steered, the 650 pods take it (30 left), as a packing
    # policy makes them do.
    workload = TargetWorkload(
        shapes=(PodShape(cpu_milli=0, gpu_milli=470, num_gpu=1), PodShape(cpu_milli=0, gpu_milli=650, num_gpu=1)),
        weights=(0.75, 0.25),
    )
    anywhere = np.ones((1, 2), dtype=np.bool_), np.array([8000])
    unsteered = HoleWaste(workload)
    steered = HoleWaste(workload, temperature=30)
    plain_id = unsteered.table_ids(model_ok=anywhere[0], cpu_free=anywhere[1])[0]
    sharp_id = steered.table_ids(model_ok=anywhere[0], cpu_free=anywhere[1])[0]
    plain, sharp = unsteered.table[plain_id], steered.table[sharp_id]
    assert plain[68] == pytest.approx(0.75 * 210 + 0.25 * 30)
    assert sharp[68] < 40  # nearly always the 650: 30 left
    assert sharp[53] == pytest.approx(60)  # only the 470 fits a 530 hole, steered or not
    assert sharp[21] == pytest.approx(210)


def test_the_eventual_waste_of_a_hole_does_not_depend_on_the_gpu_model() -> None:
    # 350 pods run only on V100. Were the V100 node's holes valued with them as fillers and the T4's
    # without, a share would look cheaper on the V100, the very GPUs those pods need.
    workload = TargetWorkload(
        shapes=(
            PodShape(cpu_milli=0, gpu_milli=350, num_gpu=1, models=frozenset({"V100"})),
            PodShape(cpu_milli=0, gpu_milli=250, num_gpu=1),
        ),
        weights=(0.5, 0.5),
    )
    core = cluster("fgpu", [node("v100", gpus=1, model="V100"), node("t4", gpus=1, model="T4")], workload=workload)
    occupy(core, "v100", [40])
    occupy(core, "t4", [40])
    policy = core.node_policy
    assert isinstance(policy, FGPUPolicy)
    policy.tracker.refresh()
    rows = np.array([core.state.slot_of["v100"], core.state.slot_of["t4"]], dtype=np.intp)
    share = Demand(gpus=1, core_percent=30, memory_bytes=None, memory_ratio_percent=30, whole=False, cpu_milli=0, host_memory_bytes=0)
    deltas = policy.hole_deltas(rows, share, wide=True)
    assert deltas[0, 0] == pytest.approx(deltas[1, 0])


@pytest.mark.parametrize(("policy", "gpu"), [("fgd", 0), ("fgpu", 1)])
def test_a_share_leaves_the_hole_a_frequent_pod_fills_and_starts_a_gpu_a_rarer_pod_completes(policy: str, gpu: int) -> None:
    # GPU 0 holds a 470 pod (530 free): the next 470 completes it to 940. A 320 share there leaves
    # 210 that nothing fills; on the free GPU 1 it leaves 680, which a 650 completes. FGD sees only
    # that the free GPU stops fitting whole pods and fills the 530 hole.
    workload = TargetWorkload(
        shapes=(
            PodShape(cpu_milli=0, gpu_milli=470, num_gpu=1),
            PodShape(cpu_milli=0, gpu_milli=650, num_gpu=1),
            PodShape(cpu_milli=0, gpu_milli=320, num_gpu=1),
            PodShape(cpu_milli=0, gpu_milli=1000, num_gpu=1),
        ),
        weights=(0.4, 0.1, 0.1, 0.4),
    )
    core = cluster(policy, [node("a", gpus=2)], workload=workload)
    occupy(core, "a", [47, 0])
    share = pod("share", milli=320, cpu=0)
    assert place(core, share) == "a"
    assert gpus_of(core, share) == ("a", (gpu,))


def test_a_share_sized_only_in_memory_bytes_does_not_make_every_hole_look_filled() -> None:
    workload = TargetWorkload(
        shapes=(PodShape(cpu_milli=0, gpu_milli=470, num_gpu=1), PodShape(cpu_milli=0, gpu_milli=0, num_gpu=1)),
        weights=(0.875, 0.125),
    )
    holes = HoleWaste(workload, temperature=30)
    table_id = holes.table_ids(model_ok=np.ones((1, 2), dtype=np.bool_), cpu_free=np.array([8000]))[0]
    table = holes.table[table_id]
    assert table[19] == pytest.approx(190)  # nothing real fits a 190 hole
    assert table[53] == pytest.approx(60)
