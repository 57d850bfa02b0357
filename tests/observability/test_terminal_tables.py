"""What fgpuctl prints to a terminal: no raw control characters, no cell longer than CELL_MAX."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from apis import names
from fgpuctl import inspect, top, validate
from fgpuctl.cluster_state import NodeRow, UnverifiedRow
from fgpuctl.text_table import CELL_MAX, cell, printable, render

HOSTILE = "x\x1b]0;owned\x07\x1b[2J\r\x9b31m\n\u202e level=error"
_CONTROL = ("\x1b", "\x07", "\r", "\n", "\x9b", "\u202e")


def _raw(text: str) -> list[str]:
    """The control characters in `text`'s lines (their own line breaks aside)."""
    return [c for line in text.split("\n") for c in _CONTROL if c in line]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("GPU-n1-00", "GPU-n1-00"),
        ("\u754c", "\u754c"),
        ("a\x1bb", "a\\x1bb"),
        ("a\rb\n", "a\\rb\\n"),
        ("\u202e", "\\u202e"),
        ("y" * (CELL_MAX + 1), "y" * (CELL_MAX - 1) + "\u2026"),
        ("y" * CELL_MAX, "y" * CELL_MAX),
    ],
)
def test_a_cell_is_escaped_and_cut(text: str, shown: str) -> None:
    assert cell(text) == shown


def test_render_aligns_and_leaves_a_free_last_column_uncut() -> None:
    long = ", ".join(f"team/pod-{i}" for i in range(20))
    lines = render([("A", "B", "PODS"), ("x" * 100, "\x1b", long)], free_last=True)
    assert lines == [f"{'A'.ljust(CELL_MAX)}  B     PODS", f"{'x' * (CELL_MAX - 1)}\u2026  \\x1b  {long}"]
    assert printable(long) == long


def _pod(gpu_id: str) -> dict[str, Any]:
    allocation = json.dumps({"gpu": [{"minor": 0, "id": gpu_id, "resources": {names.GPU_CORE: 50, names.GPU_MEMORY: 1024}}]})
    return {"metadata": {"uid": "u1", "name": "p", "namespace": "team", "annotations": {names.DEVICE_ALLOCATED: allocation}},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}


@pytest.mark.parametrize("gpu_id", ["GPU-12345678-1234-1234-1234-123456789abc", "MIG-GPU-1234abcd/1/0", "MIG-4b3c2d1e-aaaa"])
def test_top_shows_an_allocation_that_names_a_gpu_id(gpu_id: str) -> None:
    rows = top.usage_rows([top.AgentUsage(pods={}, gpu_sm_percent={}, gpu_memory_total={})], [_pod(gpu_id)])
    assert [r.gpu for r in rows] == [gpu_id]


@pytest.mark.parametrize("gpu_id", ["GPU-" + HOSTILE, "../../etc", "GPU-" + "a" * 200, "not-a-gpu"])
def test_top_leaves_out_an_allocation_id_that_is_no_gpu_id(gpu_id: str) -> None:
    rows = top.usage_rows([top.AgentUsage(pods={}, gpu_sm_percent={}, gpu_memory_total={})], [_pod(gpu_id)])
    assert rows == []


def test_top_escapes_what_an_agent_reports() -> None:
    usage = top.AgentUsage(pods={("u1", "GPU-" + HOSTILE * 20): (1, 1)}, gpu_sm_percent={}, gpu_memory_total={})
    rows = top.usage_rows([usage], [])
    for wide in (False, True):
        text = top.table(rows, wide=wide)
        assert not _raw(text) and max(len(line) for line in text.splitlines()) < 200


def test_inspect_escapes_node_and_allocation_text() -> None:
    rows = [NodeRow("n1", "", HOSTILE * 50, ())]
    unverified = [UnverifiedRow("team", "p", "u1", "n1", "bad signature: " + HOSTILE, "request", 50, 1024, HOSTILE)]
    text = inspect.table(rows, unverified)
    assert not _raw(text)
    assert "\\x1b]0;owned" in text
    assert max(len(line) for line in text.splitlines()[:2]) < 200


def test_validate_names_a_skipped_object_bare_when_plain_and_quoted_when_not() -> None:
    def skipped(kind: str, name: str) -> str:
        manifest = json.dumps({"kind": kind, "metadata": {"name": name, "namespace": "team"}})
        err = io.StringIO()
        validate.validate(files=["-"], rules_path=None, stdin=io.StringIO(manifest), out=io.StringIO(), err=err)
        return err.getvalue()

    assert "skipped Service team/web: not a Pod" in skipped("Service", "web")
    line = skipped("W" + HOSTILE, "w" * 5000)
    assert "skipped 'Wx\\x1b]0;owned\\x07" in line and "..." in line
    assert not _raw(line) and len(line) < 400
