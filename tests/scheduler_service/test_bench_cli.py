"""bench/scheduler.py keeps working and prints the agreed JSON shape (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_prints_one_json_object_per_size_with_the_agreed_keys() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scheduler.py"), "--nodes", "8,16", "--pods", "10", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )

    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["nodes"] for r in results] == [8, 16]
    for r in results:
        assert {"nodes", "p50_ms", "p99_ms", "pods_per_s"} <= set(r)
        assert 40 <= r["fill_percent"] <= 60
