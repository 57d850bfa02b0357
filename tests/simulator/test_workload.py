from __future__ import annotations

from collections import Counter

import pytest

from scheduler_plugin.core.fragmentation import PodShape, TargetWorkload
from scheduler_plugin.sim.trace import TraceError, read_nodes, read_pods
from scheduler_plugin.sim.workload import gpu_capacity_milli, order_and_tune, shape_of, typical_shapes
from tests.simulator.helpers import NODES_CSV, PODS_CSV, PODS_HEAVY_CSV, pod

CAPACITY = gpu_capacity_milli(read_nodes(NODES_CSV))


def test_without_tuning_the_order_is_a_seeded_shuffle_of_the_name_sorted_trace() -> None:
    pods = read_pods(PODS_CSV)
    first = order_and_tune(list(reversed(pods)), capacity_milli=CAPACITY, seed=3, tune=None)
    again = order_and_tune(pods, capacity_milli=CAPACITY, seed=3, tune=None)
    other = order_and_tune(pods, capacity_milli=CAPACITY, seed=4, tune=None)
    assert first.pods == again.pods, "input order must not matter: pods are sorted by name first"
    assert first.pods != other.pods
    assert sorted(p.name for p in first.pods) == sorted(p.name for p in pods)


def test_clones_are_appended_after_every_original_until_the_next_would_pass_the_target() -> None:
    pods = read_pods(PODS_CSV)
    run = order_and_tune(pods, capacity_milli=CAPACITY, seed=5, tune=1.3)
    untuned = order_and_tune(pods, capacity_milli=CAPACITY, seed=5, tune=None)
    assert run.pods[: len(pods)] == untuned.pods, "clones never mix into the originals"
    clones = run.pods[len(pods) :]
    assert len(clones) == run.clones > 0
    assert all("-clone-" in c.name for c in clones)
    by_name = {p.name: p for p in pods}
    for clone in clones:
        original = by_name[clone.name.split("-clone-")[0]]
        assert (clone.cpu_milli, clone.num_gpu, clone.gpu_milli) == (original.cpu_milli, original.num_gpu, original.gpu_milli)
    total = sum(p.total_gpu_milli for p in run.pods)
    target = 1.3 * CAPACITY
    # Each clone was admitted because its per-GPU milli fitted under the target; a multi-GPU clone may overshoot.
    before_last = total - clones[-1].total_gpu_milli
    assert before_last + clones[-1].gpu_milli <= target
    assert total <= target + max(c.total_gpu_milli - c.gpu_milli for c in clones)


def test_a_multi_gpu_clone_may_overshoot_because_only_its_per_gpu_milli_is_checked() -> None:
    # One 4-GPU pod on 4 GPUs of capacity: 1.3x = 5200 milli. Clones are added while
    # total + 1000 <= 5200, each adding 4000, so the second clone is admitted at total 4000 -> 8000.
    run = order_and_tune([pod("p", milli=1000, gpus=4)], capacity_milli=4000, seed=0, tune=1.3)
    assert run.clones == 1
    assert sum(p.total_gpu_milli for p in run.pods) == 8000


def test_a_trace_above_the_target_loses_random_pods_until_it_fits() -> None:
    pods = read_pods(PODS_HEAVY_CSV)
    run = order_and_tune(pods, capacity_milli=CAPACITY, seed=8, tune=1.3)
    untuned = order_and_tune(pods, capacity_milli=CAPACITY, seed=8, tune=None)
    total = sum(p.total_gpu_milli for p in run.pods)
    assert run.clones == 0 and run.dropped > 0
    assert total <= 1.3 * CAPACITY
    # The survivors keep their shuffled order.
    survivors = set(run.pods)
    assert run.pods == tuple(p for p in untuned.pods if p in survivors)
    assert len(run.pods) + run.dropped == len(untuned.pods)


def test_typical_shapes_cover_95_percent_of_pods_by_count_and_renormalise() -> None:
    pods = [pod(f"a{i}", milli=500) for i in range(60)]
    pods += [pod(f"b{i}", milli=1000) for i in range(36)]
    pods += [pod(f"c{i}", milli=250) for i in range(3)]
    pods += [pod("d0", milli=0, cpu=4000)]
    target = typical_shapes(pods)
    # 60 + 36 = 96 >= 95: the rare shapes are left out.
    assert target.shapes == (shape_of(pods[0]), shape_of(pods[60]))
    assert target.weights == pytest.approx((60 / 96, 36 / 96))


def test_cpu_only_pods_count_as_a_shape() -> None:
    pods = [pod(f"cpu{i}", cpu=8000) for i in range(10)]
    target = typical_shapes(pods)
    assert target.shapes == (PodShape(cpu_milli=8000, gpu_milli=0, num_gpu=0),)


def test_target_workload_rejects_mismatched_weights() -> None:
    with pytest.raises(ValueError, match="one weight per shape"):
        TargetWorkload(shapes=(PodShape(0, 1000, 1),), weights=(0.5, 0.5))


def test_shape_counts_use_the_original_trace() -> None:
    pods = read_pods(PODS_CSV)
    target = typical_shapes(pods)
    counts = Counter(shape_of(p) for p in pods)
    assert target.shapes[0] == counts.most_common(1)[0][0]


def test_tuning_a_trace_that_asks_no_gpu_is_refused_not_endless() -> None:
    cpu_only = [pod("a"), pod("b")]
    with pytest.raises(TraceError, match="the trace asks for no GPU; nothing to tune"):
        order_and_tune(cpu_only, capacity_milli=CAPACITY, seed=1, tune=1.3)
    assert len(order_and_tune(cpu_only, capacity_milli=CAPACITY, seed=1, tune=None).pods) == 2


def test_clone_names_skip_names_the_trace_already_uses() -> None:
    pods = [pod("a", milli=1000), pod("a-clone-00000", milli=1000)]
    run = order_and_tune(pods, capacity_milli=8000, seed=5, tune=1.3)
    names = [p.name for p in run.pods]
    assert run.clones > 5 and len(names) == len(set(names))
