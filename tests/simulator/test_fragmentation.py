from __future__ import annotations

import numpy as np
import pytest

from scheduler_plugin.core.fragmentation import (
    FragmentationIndex,
    PodShape,
    TargetWorkload,
    node_fragmentation,
)

HALF = PodShape(cpu_milli=2000, gpu_milli=500, num_gpu=1)
WHOLE = PodShape(cpu_milli=4000, gpu_milli=1000, num_gpu=1)
TWO = PodShape(cpu_milli=4000, gpu_milli=1000, num_gpu=2)
CPU_ONLY = PodShape(cpu_milli=2000, gpu_milli=0, num_gpu=0)
T4_ONLY = PodShape(cpu_milli=1000, gpu_milli=1000, num_gpu=1, models=frozenset({"T4"}))


def single(shape: PodShape) -> TargetWorkload:
    return TargetWorkload(shapes=(shape,), weights=(1.0,))


@pytest.mark.parametrize(
    ("shape", "free", "cpu", "expected"),
    [
        # fits: only the GPUs below its request are fragments
        (HALF, [1000, 300, 600], 8000, 300),
        (WHOLE, [1000, 300, 600], 8000, 900),
        # too few GPUs with enough free: everything idle is a fragment
        (TWO, [1000, 300, 600], 8000, 1900),
        (TWO, [1000, 1000, 600], 8000, 600),
        # CPU short: all idle GPU
        (HALF, [1000, 300], 1000, 1300),
        # CPU-only shape: all idle GPU
        (CPU_ONLY, [1000, 300], 8000, 1300),
        # model not allowed: all idle GPU
        (T4_ONLY, [1000, 1000], 8000, 2000),
    ],
)
def test_node_fragment_follows_the_fgd_definition(shape: PodShape, free: list[int], cpu: int, expected: int) -> None:
    assert node_fragmentation(gpu_free_milli=free, cpu_free_milli=cpu, model="G2", workload=single(shape)) == expected


def test_node_fragmentation_is_the_frequency_weighted_sum() -> None:
    workload = TargetWorkload(shapes=(HALF, WHOLE), weights=(0.25, 0.75))
    value = node_fragmentation(gpu_free_milli=[1000, 300, 600], cpu_free_milli=8000, model="G2", workload=workload)
    assert value == pytest.approx(0.25 * 300 + 0.75 * 900)


def _brute_force(index: FragmentationIndex, row: int, free: list[int], cpu: int, model: str) -> float:
    return node_fragmentation(gpu_free_milli=free, cpu_free_milli=cpu, model=model, workload=index.workload)


def test_incremental_share_deltas_equal_recomputing_the_node() -> None:
    workload = TargetWorkload(
        shapes=(HALF, WHOLE, TWO, CPU_ONLY, T4_ONLY, PodShape(3000, 250, 1)), weights=(0.3, 0.3, 0.1, 0.1, 0.1, 0.1)
    )
    index = FragmentationIndex(workload=workload, max_gpus=4)
    rng = np.random.default_rng(0)
    nodes = []
    for row in range(30):
        free = [int(x) for x in rng.choice([0, 100, 250, 500, 750, 1000], size=4)]
        cpu = int(rng.integers(0, 10)) * 1000
        model = "T4" if row % 3 == 0 else "G2"
        index.set_node(row, model=model, gpu_free_milli=free, cpu_free_milli=cpu)
        nodes.append((free, cpu, model))
    rows = np.arange(30)
    for cpu_req, milli in [(1000, 250), (2000, 500), (0, 100), (3000, 750)]:
        deltas = index.sharing_deltas(rows, cpu_milli=cpu_req, gpu_milli=milli)
        for row, (free, cpu, model) in enumerate(nodes):
            before = _brute_force(index, row, free, cpu, model)
            for g in range(4):
                if free[g] < milli:
                    assert np.isinf(deltas[row, g])
                    continue
                after_free = list(free)
                after_free[g] -= milli
                after = _brute_force(index, row, after_free, cpu - cpu_req, model)
                assert deltas[row, g] == pytest.approx(after - before, abs=1e-9)


def test_whole_gpu_deltas_take_the_lowest_indexed_free_gpus() -> None:
    index = FragmentationIndex(workload=TargetWorkload(shapes=(HALF, WHOLE), weights=(0.5, 0.5)), max_gpus=4)
    index.set_node(0, model="G2", gpu_free_milli=[400, 1000, 1000, 1000], cpu_free_milli=16000)
    after = index.exclusive_after(np.array([0]), gpu_milli=1000, num_gpu=2)
    assert after.tolist() == [[400, 0, 0, 1000]]
    delta = index.exclusive_deltas(np.array([0]), cpu_milli=4000, gpu_milli=1000, num_gpu=2)
    before = node_fragmentation(gpu_free_milli=[400, 1000, 1000, 1000], cpu_free_milli=16000, model="G2", workload=index.workload)
    after_value = node_fragmentation(gpu_free_milli=[400, 0, 0, 1000], cpu_free_milli=12000, model="G2", workload=index.workload)
    assert delta[0] == pytest.approx(after_value - before)


def test_an_unchanged_fragment_gives_exactly_zero_delta() -> None:
    # CPU-only pod on a node with plenty of CPU: nothing changes, and the delta must be 0.0, not float noise.
    workload = TargetWorkload(shapes=(HALF, WHOLE, CPU_ONLY), weights=(0.1, 0.7, 0.2))
    index = FragmentationIndex(workload=workload, max_gpus=2)
    index.set_node(0, model="G2", gpu_free_milli=[330, 1000], cpu_free_milli=64000)
    assert index.exclusive_deltas(np.array([0]), cpu_milli=1000, gpu_milli=0, num_gpu=0)[0] == 0.0


def test_cleared_rows_hold_no_fragment() -> None:
    index = FragmentationIndex(workload=single(WHOLE), max_gpus=2)
    index.set_node(0, model="G2", gpu_free_milli=[300, 1000], cpu_free_milli=1000)
    assert index.total() == 1300
    index.clear_rows(np.array([0]))
    assert index.total() == 0
