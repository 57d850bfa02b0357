"""bench/packing.py end to end on a tiny grid: 2 variants of the test trace, 1 seed, three configurations."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from tests.simulator.helpers import NODES_CSV, PODS_CSV

BENCH = Path(__file__).resolve().parents[2] / "bench" / "packing.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("packing_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def test_a_small_grid_replays_every_configuration_and_reports_the_difference(tmp_path: Path) -> None:
    packing = load_bench()
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "openb_node_list_gpu_node.csv").write_text(NODES_CSV.read_text())
    (traces / "openb_pod_list_default.csv").write_text(PODS_CSV.read_text())
    (traces / "openb_pod_list_gpuspec20.csv").write_text(PODS_CSV.read_text())
    results, images = tmp_path / "results", tmp_path / "images"
    code = packing.main(
        [
            "--traces", str(traces), "--variant", "share100", "spec40", "--given", "--seeds", "42", "--jobs", "1",
            "--variant-dir", str(tmp_path / "variants"), "--results", str(results), "--images", str(images),
        ]
    )
    assert code == 0
    report = json.loads((results / "packing.json").read_text())
    runs = report["runs"]
    assert {(r["workload"], r["config"]) for r in runs} == {
        (w, c) for w in ("share100", "spec40") for c in ("fgpu", "fgd-live", "fgd-told")
    }
    assert all(0 < r["alloc_at_100"] <= 100 and r["seed"] == 42 for r in runs)
    by = {(r["workload"], r["config"]): r["alloc_at_100"] for r in runs}
    for row in report["summary"]:
        assert row["fgpu_minus_fgd_told"] == round(by[(row["workload"], "fgpu")] - by[(row["workload"], "fgd-told")], 3)
    table = (results / "packing.md").read_text()
    assert "| share100 | 42 |" in table and "| spec40 | 42 |" in table
    assert (images / "packing-share.svg").read_text().startswith("<svg")
    assert (tmp_path / "variants" / "spec40.csv").exists()
