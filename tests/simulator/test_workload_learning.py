"""Without a target workload (a live cluster) fgd and fgpu learn the typical pod shapes from the pods placed."""

from __future__ import annotations

import json

import pytest

from fgpuctl.main import main as fgpuctl
from scheduler_plugin.core.api import NodeInfo, NodeName
from scheduler_plugin.core.demand import Demand
from scheduler_plugin.core.fragmentation import PodShape
from scheduler_plugin.core.policy_fgd import GENERIC_WORKLOAD, FGDPolicy
from scheduler_plugin.core.policy_fgpu import FGPUPolicy
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.core.workload_learning import WorkloadLearner, shape_of
from scheduler_plugin.sim.replay import build_scheduler, node_devices, place, pod_request, replay
from scheduler_plugin.sim.trace import read_nodes, read_pods
from tests.simulator.helpers import NODES_CSV, PODS_CSV, node, pod


def share(percent: int, *, cpu: int = 4000, models: frozenset[str] = frozenset()) -> Demand:
    return Demand(
        gpus=1,
        core_percent=percent,
        memory_bytes=None,
        memory_ratio_percent=percent,
        whole=False,
        cpu_milli=cpu,
        host_memory_bytes=8 << 30,
        model_use=models,
    )


CPU_ONLY = Demand(gpus=0, core_percent=0, memory_bytes=None, memory_ratio_percent=None, whole=False, cpu_milli=12000)


def test_a_demand_s_shape_is_what_fgd_counts() -> None:
    assert shape_of(share(47, models=frozenset({"A10"}))) == PodShape(
        cpu_milli=4000, gpu_milli=470, num_gpu=1, models=frozenset({"A10"})
    )
    assert shape_of(CPU_ONLY) == PodShape(cpu_milli=12000, gpu_milli=0, num_gpu=0)


def test_the_workload_is_learnt_after_the_warmup_then_as_the_count_doubles_then_every_window() -> None:
    learner = WorkloadLearner(warmup=4, relearn_every=16)
    due = [n for n in range(1, 61) if learner.observe(share(47)) is not None]
    assert due == [4, 8, 16, 32, 48]


def test_the_learnt_workload_holds_the_most_frequent_shapes_up_to_the_coverage() -> None:
    learner = WorkloadLearner(warmup=20, coverage=0.9)
    learnt = None
    for demand in [share(47)] * 12 + [share(81)] * 6 + [CPU_ONLY, share(16)]:
        learnt = learner.observe(demand) or learnt
    assert learnt is not None
    assert learnt.shapes == (shape_of(share(47)), shape_of(share(81)))
    assert learnt.weights == pytest.approx((12 / 18, 6 / 18))
    # GPU pods ask 8 GiB per 0.47 or 0.81 GPU (the CPU-only pod's memory is not counted).
    gpu_milli = 12 * 470 + 6 * 810 + 160
    assert learnt.memory_per_gpu_milli == pytest.approx(19 * (8 << 30) / gpu_milli)


def test_old_pods_fade_once_the_cluster_s_mix_changes() -> None:
    learner = WorkloadLearner(warmup=1, relearn_every=8)
    for _ in range(16):
        learner.observe(share(47))
    learnt = None
    for _ in range(48):
        learnt = learner.observe(share(81)) or learnt
    assert learnt is not None
    assert learnt.shapes == (shape_of(share(81)),)


@pytest.mark.parametrize("policy_type", [FGDPolicy, FGPUPolicy])
def test_without_a_workload_the_policy_starts_from_the_stand_in_and_learns_the_pods_it_places(
    policy_type: type[FGDPolicy],
) -> None:
    core = build_scheduler([node(f"n{i}", gpus=8, cpu=256000, memory_mib=1 << 20) for i in range(8)], policy=policy_type.name, seed=0, workload=None)
    policy = core.node_policy
    assert isinstance(policy, policy_type)
    assert policy.index.workload == GENERIC_WORKLOAD
    for i in range(64):
        assert place(core, pod(f"p{i}", milli=470 if i % 2 else 650, cpu=4000)) is not None
    learnt = policy.index.workload
    assert set(learnt.shapes) == {
        PodShape(cpu_milli=4000, gpu_milli=470, num_gpu=1),
        PodShape(cpu_milli=4000, gpu_milli=650, num_gpu=1),
    }
    if isinstance(policy, FGPUPolicy):
        assert policy.holes.workload == learnt


def test_a_given_workload_is_never_replaced() -> None:
    core = build_scheduler([node("n", gpus=8, cpu=256000, memory_mib=1 << 20)], policy="fgpu", seed=0, workload=GENERIC_WORKLOAD)
    for i in range(80):
        place(core, pod(f"p{i}", milli=470, cpu=1000))
    policy = core.node_policy
    assert isinstance(policy, FGPUPolicy)
    assert policy.index.workload == GENERIC_WORKLOAD


def test_a_replay_that_learns_the_workload_is_deterministic_and_places_pods() -> None:
    nodes, pods = read_nodes(NODES_CSV), read_pods(PODS_CSV)
    first = replay(nodes=nodes, pods=pods, policy="fgpu", seed=5, learn_workload=True)
    second = replay(nodes=nodes, pods=pods, policy="fgpu", seed=5, learn_workload=True)
    assert first.records.alloc_pct == second.records.alloc_pct
    assert first.placed > 0


def test_simulate_learns_the_workload_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--nodes", str(NODES_CSV), "--pods", str(PODS_CSV), "--policy", "fgpu", "--seed", "3", "--json"]
    assert fgpuctl([*argv, "--learn-workload"]) == 0
    learnt = json.loads(capsys.readouterr().out)
    expected = replay(nodes=read_nodes(NODES_CSV), pods=read_pods(PODS_CSV), policy="fgpu", seed=3, learn_workload=True)
    assert learnt["alloc_at_100_by_seed"] == [round(expected.alloc_at_100, 3)]


def _core(*, policy: str, gpu_policy: str | None = None) -> Scheduler:
    core = Scheduler(policy=policy, gpu_policy=gpu_policy, tie_break_seed=0)
    for i in range(8):
        trace_node = node(f"n{i}", gpus=8, cpu=256000, memory_mib=1 << 20)
        core.upsert_node_info(NodeInfo(name=NodeName(trace_node.name), cpu_milli=trace_node.cpu_milli, memory_bytes=trace_node.memory_mib << 20))
        core.upsert_node_devices(node_devices(trace_node))
    return core


def test_a_gpu_level_policy_of_its_own_learns_from_every_pod_placed() -> None:
    core = _core(policy="binpack", gpu_policy="fgpu")
    for i in range(48):
        request = pod_request(pod(f"p{i}", milli=320 if i % 3 else 1000, cpu=2000))
        chosen = core.select(request)
        assert chosen is not None
        core.reserve(request, chosen)
    gpu_policy = core.gpu_policy
    assert isinstance(gpu_policy, FGPUPolicy)
    assert set(gpu_policy.index.workload.shapes) == {
        PodShape(cpu_milli=2000, gpu_milli=320, num_gpu=1),
        PodShape(cpu_milli=2000, gpu_milli=1000, num_gpu=1),
    }


def test_pods_found_bound_teach_a_fresh_core_and_each_pod_counts_once() -> None:
    # A restarted or newly elected scheduler loads the bound pods through add_pod.
    first = _core(policy="fgpu")
    placed = []
    for i in range(32):
        request = pod_request(pod(f"p{i}", milli=470, cpu=1000))
        chosen = first.select(request)
        assert chosen is not None
        placed.append((request, chosen, first.reserve(request, chosen)))
    for request, chosen, allocation in placed:  # the informer then sees them bound
        first.confirm(request.uid)
        first.add_pod(request, chosen, allocation)
    policy = first.node_policy
    assert isinstance(policy, FGPUPolicy) and policy.learner is not None
    assert policy.learner.seen == 32

    second = _core(policy="fgpu")
    for request, chosen, allocation in placed:
        second.add_pod(request, chosen, allocation)
    fresh = second.node_policy
    assert isinstance(fresh, FGPUPolicy)
    assert fresh.index.workload.shapes == (PodShape(cpu_milli=1000, gpu_milli=470, num_gpu=1),)


def test_fgpu_strands_by_the_cpu_ratio_of_the_pods_it_learnt() -> None:
    nodes = [node(f"n{i}", gpus=8, cpu=256000, memory_mib=1 << 20) for i in range(4)]
    core = build_scheduler(nodes, policy="fgpu", seed=0, workload=None)
    for i in range(64):
        assert place(core, pod(f"p{i}", milli=500, cpu=6000)) is not None
    policy = core.node_policy
    assert isinstance(policy, FGPUPolicy)
    assert policy.ratios.cpu == pytest.approx(12.0)  # 6000 CPU milli per 500 milli-GPU
