"""The scheduler's `reason` label: the values docs/scheduler.md lists are the ones it exports."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from scheduler_plugin.metrics import Metrics, ReasonKind

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"


def documented_kinds() -> set[str]:
    """The backticked values in the first column of the table headed `| \\`reason\\` |`."""
    lines = DOC.read_text().splitlines()
    start = lines.index("| `reason` | the node was rejected because |")
    kinds: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        kinds.update(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return kinds


def test_the_documented_reason_kinds_are_exactly_the_exported_ones() -> None:
    families = text_string_to_metric_families(Metrics().exposition().decode())
    exported = {
        s.labels["reason"]
        for f in families
        if f.name == "fgpu_scheduler_unschedulable_reasons"
        for s in f.samples
        if s.name.endswith("_total")
    }

    assert exported == {k.value for k in ReasonKind}
    assert documented_kinds() == exported
