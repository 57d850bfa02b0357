"""Held-out traces against the trace replay (`scheduler_plugin/sim/`, `fgpuctl simulate`).

Each trace here is one the authors' tests never tried: a format variant the trace README allows
or a user's hand-made trace could have, written small from Python into a temp dir. Each test is
written for a defect found in review and guards its fix.
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from fgpuctl.main import main as fgpuctl_main
from scheduler_plugin.sim.replay import replay
from scheduler_plugin.sim.trace import TraceError, TraceNode, TracePod, read_nodes, read_pods
from scheduler_plugin.sim.variants import VariantSpec, make_variant
from scheduler_plugin.sim.workload import order_and_tune

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def alarm() -> Iterator[None]:
    """Turns a hang into a TimeoutError after 1 s (the loop under test is pure Python)."""

    def fire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError("still running after 1 s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_cpu_only_trace_does_not_hang_the_tuning(alarm: None) -> None:
    pods = [TracePod(name="only", cpu_milli=1000, memory_mib=1024, num_gpu=0, gpu_milli=0)]
    try:
        run = order_and_tune(pods, capacity_milli=8000, seed=42, tune=1.3)
    except ValueError as error:  # a clear refusal is as good as a finite run
        assert "GPU" in str(error)
        return
    assert run.pods


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text(POD_HEADER + "p1,1000,1024,1,500,\n", encoding="utf-8-sig")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEADER + "n1,32000,65536,2,G2\n", encoding="utf-8-sig")
    assert [p.name for p in read_pods(pods)] == ["p1"]
    assert [n.name for n in read_nodes(nodes)] == ["n1"]


def test_a_file_not_in_utf8_is_a_trace_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_bytes((POD_HEADER + "caf\xe9,1000,1024,1,500,\n").encode("latin-1"))
    with pytest.raises(TraceError, match=str(path)):
        read_pods(path)


def test_a_csv_syntax_error_is_a_trace_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "pods.csv", POD_HEADER + 'p1,1000,1024,1,500,"' + "G2|" * 50_000 + '"\n')
    with pytest.raises(TraceError, match=str(path)):
        read_pods(path)


def test_an_unterminated_quote_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "pods.csv", POD_HEADER + 'p1,1000,1024,1,500,"G2\np2,1000,1024,1,500,\np3,0,0,0,0,\n')
    with pytest.raises(TraceError, match=str(path)):
        read_pods(path)


def test_a_row_longer_than_the_header_is_refused(tmp_path: Path) -> None:
    # An unquoted comma inside gpu_spec: the pod would silently lose its T4 permission.
    path = _write(tmp_path / "pods.csv", POD_HEADER + "p1,1000,1024,1,500,G2,T4\n")
    with pytest.raises(TraceError, match=f"{path}:2"):
        read_pods(path)


@pytest.mark.parametrize("spec", ['"G2,T4"', "G2;T4"])
def test_a_gpu_spec_with_another_separator_is_not_silently_one_model(tmp_path: Path, spec: str) -> None:
    path = _write(tmp_path / "pods.csv", POD_HEADER + f"p1,1000,1024,1,500,{spec}\n")
    try:
        (pod,) = read_pods(path)
    except TraceError as error:
        assert f"{path}:2" in str(error) and "gpu_spec" in str(error)
        return
    assert pod.gpu_spec == ("G2", "T4")


def test_duplicate_pod_names_do_not_inflate_the_allocation(tmp_path: Path) -> None:
    path = _write(tmp_path / "pods.csv", POD_HEADER + "a,1000,1024,1,500,\na,1000,1024,1,500,\nc,1000,1024,1,500,\n")
    try:
        pods = read_pods(path)
    except TraceError as error:
        assert f"{path}:3" in str(error) and "name" in str(error)
        return
    node = TraceNode(name="n1", cpu_milli=32000, memory_mib=65536, gpus=1, model="G2")
    for seed in range(42, 52):
        result = replay(nodes=[node], pods=pods, policy="bestfit", seed=seed, tune=None)
        # Three half-GPU pods on one GPU: two fit, whatever their names.
        assert result.placed == 2 and max(result.records.alloc_pct) == 100.0, (seed, result.records.alloc_pct)


def test_a_variant_of_a_variant_keeps_pod_names_unique() -> None:
    nodes = [TraceNode(name="n1", cpu_milli=64000, memory_mib=262144, gpus=8, model="G2")]
    base = [
        TracePod(name="variant-cpu-00000", cpu_milli=1000, memory_mib=1024, num_gpu=0, gpu_milli=0),
        TracePod(name="g1", cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=1000),
    ]
    variant = make_variant(base, nodes=nodes, spec=VariantSpec(seed=0, cpu_only=3.0))
    names = [p.name for p in variant]
    assert len(names) == len(set(names)), sorted(names)


def test_a_node_without_cpu_hosts_no_pod_that_asks_cpu(tmp_path: Path) -> None:
    path = _write(tmp_path / "nodes.csv", NODE_HEADER + "n1,0,262144,2,G2\n")
    try:
        nodes = read_nodes(path)
    except TraceError as error:
        assert f"{path}:2" in str(error) and "cpu_milli" in str(error)
        return
    pods = [TracePod(name="p1", cpu_milli=4000, memory_mib=1024, num_gpu=1, gpu_milli=1000)]
    result = replay(nodes=nodes, pods=pods, policy="bestfit", seed=42, tune=None)
    assert result.placed == 0


def test_no_headline_at_100_when_the_run_never_arrives_near_100(tmp_path: Path) -> None:
    node = TraceNode(name="n1", cpu_milli=64000, memory_mib=262144, gpus=8, model="G2")
    # 20 whole-GPU-tenth pods: arrived climbs 1.25 points a pod up to 25%, far below 100.
    pods = [TracePod(name=f"p{i:02d}", cpu_milli=100, memory_mib=100, num_gpu=1, gpu_milli=100) for i in range(20)]
    try:
        result = replay(nodes=[node], pods=pods, policy="bestfit", seed=42, tune=None)
    except ValueError:
        return
    assert max(result.records.arrived_pct) == pytest.approx(25.0)
    assert math.isnan(result.alloc_at_100), f"alloc_at_100 = {result.alloc_at_100} at 25% arrived"


def test_simulate_json_is_strict_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = _write(tmp_path / "nodes.csv", NODE_HEADER + "n1,64000,262144,8,G2\n")
    pods = _write(tmp_path / "pods.csv", POD_HEADER + "a,1000,1024,1,1000,\n")
    # Tuned to half the capacity, arrival ends at 50%, far from where fragmentation is measured.
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit", "--seed", "42", "--tune", "0.5"]
    code = fgpuctl_main([*argv, "--json"])
    out = capsys.readouterr().out
    assert code == 0

    def refuse(constant: str) -> float:
        raise ValueError(f"{constant} is not JSON")

    json.loads(out, parse_constant=refuse)
