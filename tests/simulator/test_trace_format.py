"""The CSV layer of trace reading: encodings, CSV syntax, row width, name and capacity rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from scheduler_plugin.sim.churn import read_lifetimes
from scheduler_plugin.sim.trace import TraceError, read_nodes, read_pods

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"


def _refusal(read: Callable[[Path], object], path: Path) -> str:
    with pytest.raises(TraceError) as caught:
        read(path)
    return str(caught.value)


def test_a_bom_is_dropped_for_pods_nodes_and_lifetimes(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\np1,1,1,1,500,5,9\n",
                    encoding="utf-8-sig")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODE_HEADER + "n1,32000,65536,2,G2\n", encoding="utf-8-sig")
    assert read_pods(pods)[0].name == "p1"
    assert read_nodes(nodes)[0].name == "n1"
    assert read_lifetimes(pods) == {"p1": (5, 9)}


def test_a_byte_that_is_not_utf8_is_named_with_its_line_and_position(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (POD_HEADER + "ok,1,1,0,0,\ncaf\xe9,1,1,0,0,\n").encode("latin-1"))
    position = path.read_bytes().index(b"\xe9")
    message = _refusal(read_pods, path)
    assert f"{path}:3: byte {position} (0xe9)" in message and "save the file as UTF-8" in message


def test_an_unclosed_quote_names_the_line_it_opens_on(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "p0,1,1,0,0,\np1,1,1,1,500,\"G2\np2,1,1,1,500,\np3,1,1,1,500,\n")
    message = _refusal(read_pods, path)
    assert f"{path}:3:" in message and "close every quote" in message


def test_a_field_over_the_csv_limit_is_a_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(NODE_HEADER + "n1,1,1,1,\"" + "G" * 200_000 + "\"\n")
    assert "field larger than field limit" in _refusal(read_nodes, path)


def test_a_row_longer_than_the_header_names_the_extra_values(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "p0,1,1,0,0,\np1,1000,1024,1,500,G2,T4,V100M32\n")
    message = _refusal(read_pods, path)
    assert f"{path}:3: 8 values for the header's 6 columns" in message and "'T4,V100M32'" in message


def test_trailing_empty_values_lose_nothing_and_pass(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "p1,1000,1024,1,500,G2,,\n\n")
    (only,) = read_pods(path)
    assert only.gpu_spec == ("G2",)


def test_lines_count_physical_lines_across_quoted_newlines(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "\"p\n0\",1,1,0,0,\np1,1,1,1,455,\n")
    assert f"{path}:4:" in _refusal(read_pods, path)


@pytest.mark.parametrize("spec", ['"G2,T4"', "G2;T4", "G2 T4", '"T4|G2, A10"'])
def test_a_gpu_spec_with_another_separator_is_refused(tmp_path: Path, spec: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + f"p1,1000,1024,1,500,{spec}\n")
    message = _refusal(read_pods, path)
    assert f"{path}:2: column gpu_spec" in message and "separate models with |" in message


def test_spaces_around_the_bar_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "p1,1000,1024,1,500,T4 | G2\n")
    assert read_pods(path)[0].gpu_spec == ("G2", "T4")


def test_a_repeated_pod_name_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + "a,1,1,0,0,\nb,1,1,0,0,\n a ,1,1,0,0,\n")
    assert f"{path}:4: column name = 'a' repeats the pod on line 2" in _refusal(read_pods, path)


def test_a_repeated_node_name_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(NODE_HEADER + "n1,1000,1024,1,T4\nn1,1000,1024,1,T4\n")
    assert f"{path}:3: column sn = 'n1' repeats an earlier node (line 2)" in _refusal(read_nodes, path)


@pytest.mark.parametrize(("row", "column"), [("n1,0,65536,2,G2", "cpu_milli"), ("n1,32000,0,2,G2", "memory_mib")])
def test_a_gpu_node_without_cpu_or_memory_is_refused(tmp_path: Path, row: str, column: str) -> None:
    path = tmp_path / "nodes.csv"
    path.write_text(NODE_HEADER + row + "\n")
    message = _refusal(read_nodes, path)
    assert f"{path}:2: column {column} = 0 on a node with 2 GPU(s)" in message


def test_a_cpu_only_node_may_list_zero_capacity(tmp_path: Path) -> None:
    # The replay drops CPU-only nodes, so their capacity cannot leak into a run.
    path = tmp_path / "nodes.csv"
    path.write_text(NODE_HEADER + "c1,0,0,0,\nn1,32000,65536,2,G2\n")
    assert [n.name for n in read_nodes(path)] == ["c1", "n1"]
