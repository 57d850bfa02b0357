from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_plugin.sim.trace import TraceError, read_nodes, read_pods
from tests.simulator.helpers import NODES_CSV, PODS_CSV


def test_reads_the_node_list_in_file_order() -> None:
    nodes = read_nodes(NODES_CSV)
    assert [n.name for n in nodes][:2] == ["sim-node-a", "sim-node-b"]
    assert (nodes[0].cpu_milli, nodes[0].memory_mib, nodes[0].gpus, nodes[0].model) == (32000, 131072, 8, "G2")


def test_reads_pods_with_their_gpu_model_lists() -> None:
    pods = read_pods(PODS_CSV)
    constrained = [p for p in pods if p.gpu_spec]
    assert constrained, "the synthetic trace carries gpu_spec pods"
    assert all(set(p.gpu_spec) <= {"G2", "V100M32", "T4"} for p in constrained)
    assert all(p.gpu_spec == () for p in pods if p.num_gpu == 0)


def test_reads_the_five_column_multigpu_format(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,2,1000\n")
    (only,) = read_pods(path)
    assert (only.num_gpu, only.gpu_milli, only.gpu_spec, only.total_gpu_milli) == (2, 1000, (), 2000)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("p1,1000,1024,1,abc", "column gpu_milli = 'abc' is not an integer"),
        ("p1,1000,1024,1,455", "gpu_milli = 455 is not a multiple of 10"),
        ("p1,1000,1024,1,1200", "gpu_milli = 1200 is out of range"),
        ("p1,1000,1024,0,500", "gpu_milli = 500 with num_gpu = 0"),
        ("p1,1000,1024,2,500", "a sharing pod asks for one GPU"),
        (",1000,1024,1,500", "column name is empty"),
    ],
)
def test_a_bad_pod_row_names_line_column_value_and_fix(tmp_path: Path, row: str, expected: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n{row}\n")
    with pytest.raises(TraceError) as caught:
        read_pods(path)
    message = str(caught.value)
    assert f"{path}:2" in message
    assert expected in message


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,gpu,model\nn1,1000,1,T4\n")
    with pytest.raises(TraceError, match="lacks column\\(s\\) memory_mib"):
        read_nodes(path)


def test_a_missing_file_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot open trace file"):
        read_nodes(tmp_path / "absent.csv")


def test_duplicate_node_names_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,1000,1024,1,T4\nn1,1000,1024,1,T4\n")
    with pytest.raises(TraceError, match="repeats an earlier node"):
        read_nodes(path)
