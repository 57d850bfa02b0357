from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from fgpuctl.main import main as fgpuctl
from scheduler_plugin.core.api import PodUID
from scheduler_plugin.sim.records import headline, headline_mask
from scheduler_plugin.sim.replay import build_scheduler, place, replay
from scheduler_plugin.sim.trace import read_nodes, read_pods
from scheduler_plugin.sim.workload import gpu_capacity_milli, order_and_tune, typical_shapes
from tests.simulator.helpers import ALL_POLICIES, NODES_CSV, PODS_CSV, PODS_HEAVY_CSV

NODES = read_nodes(NODES_CSV)
PODS = read_pods(PODS_CSV)


def test_a_replay_is_deterministic_for_a_seed() -> None:
    first = replay(nodes=NODES, pods=PODS, policy="fgd", seed=7)
    second = replay(nodes=NODES, pods=PODS, policy="fgd", seed=7)
    assert first.records.arrived_pct == second.records.arrived_pct
    assert first.records.alloc_pct == second.records.alloc_pct
    assert np.array_equal(first.records.frag_pct, second.records.frag_pct, equal_nan=True)
    assert (first.placed, first.failed) == (second.placed, second.failed)


def test_seeds_change_the_order_and_the_outcome() -> None:
    outcomes = {replay(nodes=NODES, pods=PODS, policy="random", seed=s).records.alloc_pct for s in range(4)}
    assert len(outcomes) > 1


def test_records_start_at_zero_and_follow_every_pod() -> None:
    result = replay(nodes=NODES, pods=PODS, policy="bestfit", seed=1)
    assert result.records.arrived_pct[0] == 0.0 and result.records.alloc_pct[0] == 0.0
    assert len(result.records.arrived_pct) == result.pods + 1 == result.placed + result.failed + 1
    assert list(result.records.arrived_pct) == sorted(result.records.arrived_pct)
    assert all(a <= b + 1e-9 for a, b in zip(result.records.alloc_pct, result.records.arrived_pct, strict=True))


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_policy_respects_every_constraint_over_a_whole_replay(policy: str) -> None:
    nodes = {n.name: n for n in NODES}
    capacity = gpu_capacity_milli(NODES)
    pods = read_pods(PODS_HEAVY_CSV)
    run = order_and_tune(pods, capacity_milli=capacity, seed=3, tune=1.3)
    core = build_scheduler(NODES, policy=policy, seed=3, workload=typical_shapes(pods))
    cpu: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    gpu: dict[tuple[str, int], int] = defaultdict(int)
    placed = 0
    for pod in run.pods:
        node = place(core, pod)
        if node is None:
            continue
        placed += 1
        found = core.allocation_of(PodUID(pod.name))
        cpu[node] += pod.cpu_milli
        memory[node] += pod.memory_mib
        if pod.num_gpu:
            assert found is not None
            _, allocation = found
            assert len(allocation.gpus) == pod.num_gpu
            assert len({share.minor for share in allocation.gpus}) == pod.num_gpu
            for share in allocation.gpus:
                gpu[(node, share.minor)] += pod.gpu_milli
            if pod.gpu_spec:
                assert nodes[node].model in pod.gpu_spec
    assert placed > 0
    for name, used in cpu.items():
        assert used <= nodes[name].cpu_milli
        assert memory[name] <= nodes[name].memory_mib
    for (name, minor), used in gpu.items():
        assert minor < nodes[name].gpus
        assert used <= 1000


def test_the_headline_bin_is_arrived_rounding_half_even_to_100() -> None:
    arrived = [98.0, 99.4, 99.5, 100.0, 100.5, 100.6]
    alloc = [1.0, 2.0, 10.0, 20.0, 30.0, 99.0]
    assert headline_mask(arrived).tolist() == [False, False, True, True, True, False]
    assert headline(alloc, arrived) == pytest.approx(20.0)


def test_the_headline_bin_widens_when_no_record_rounds_to_100() -> None:
    assert headline([5.0, 7.0, 9.0], [98.0, 99.2, 101.7]) == pytest.approx(7.0)


def test_a_tiny_cluster_falls_back_to_the_last_record_below_100() -> None:
    assert headline([5.0, 7.0, 9.0], [90.0, 96.0, 104.0]) == pytest.approx(7.0)


@pytest.mark.parametrize("arrived", [[0.0, 40.0, 96.0], [0.0, 96.0, 98.9, 98.9], [0.0, 96.0, 100.9]])
def test_no_headline_when_the_arrival_never_crosses_the_window(arrived: list[float]) -> None:
    # The last case is inside the widened bin, so it has a headline: only a short stop has none.
    value = headline([1.0, 2.0, 3.0, 4.0][: len(arrived)], arrived)
    assert math.isnan(value) == (max(arrived) < 99.0)


def test_simulate_says_when_arrival_never_reached_100(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,8,G2\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,1,1000\nb,1000,1024,1,500\n")
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit", "--seed", "1", "--tune", "0"]
    assert fgpuctl(argv) == 0
    text = capsys.readouterr().out
    assert "alloc@100    n/a" in text and "arrival peaked at 18.75% of GPU capacity, never near 100%" in text
    assert fgpuctl([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["alloc_at_100"] is None and report["alloc_at_100_by_seed"] == [None]
    assert report["frag_at_100"] is None and report["curve"][-1] == [19.0, 18.75]


def test_simulate_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code = fgpuctl(
        ["simulate", "--nodes", str(NODES_CSV), "--pods", str(PODS_CSV), "--policy", "fgd", "--seed", "1", "2", "--json"]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"policy", "seeds", "alloc_at_100", "alloc_at_100_by_seed", "frag_at_100", "curve"}
    assert report["policy"] == "fgd" and report["seeds"] == [1, 2]
    assert len(report["alloc_at_100_by_seed"]) == 2
    assert report["alloc_at_100"] == pytest.approx(sum(report["alloc_at_100_by_seed"]) / 2, abs=1e-3)
    assert not math.isnan(report["frag_at_100"])
    assert all(len(point) == 2 for point in report["curve"])


def test_simulate_compares_several_policies_as_a_json_list(capsys: pytest.CaptureFixture[str]) -> None:
    code = fgpuctl(
        ["simulate", "--nodes", str(NODES_CSV), "--pods", str(PODS_CSV), "--policy", "fgd,random", "--seed", "1", "--json"]
    )
    assert code == 0
    assert [r["policy"] for r in json.loads(capsys.readouterr().out)] == ["fgd", "random"]


def test_simulate_names_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code = fgpuctl(["simulate", "--nodes", str(NODES_CSV), "--pods", str(PODS_CSV), "--policy", "nope"])
    assert code == 2
    assert "unknown policy nope" in capsys.readouterr().err


def test_simulate_reports_a_broken_trace_file(capsys: pytest.CaptureFixture[str]) -> None:
    code = fgpuctl(["simulate", "--nodes", str(NODES_CSV), "--pods", "/nonexistent.csv", "--policy", "fgd"])
    assert code == 2
    assert "cannot open trace file" in capsys.readouterr().err


def test_simulate_plot_draws_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "curve.png"
    code = fgpuctl(
        ["simulate", "--nodes", str(NODES_CSV), "--pods", str(PODS_CSV), "--policy", "fgd,fgpu", "--seed", "1", "--plot", str(out)]
    )
    assert code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_plot_without_matplotlib_says_how_to_install_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("matplotlib is installed here")
    code = fgpuctl(
        ["simulate", "--nodes", str(NODES_CSV), "--pods", str(PODS_CSV), "--policy", "fgd", "--seed", "1", "--plot", str(tmp_path / "x.png")]
    )
    assert code == 2
    assert "pip install 'fgpu[plot]'" in capsys.readouterr().err
