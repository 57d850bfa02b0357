from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from scheduler_plugin.core.api import NodeName, NodeVerdict
from scheduler_plugin.events import EventRecorder, summarize
from tests.scheduler_service.builders import whole_pod


def verdict(node: str, reason: str = "", *, ok: bool = False) -> NodeVerdict:
    return NodeVerdict(NodeName(node), ok, reason)


def test_summary_counts_identical_reasons_most_frequent_first() -> None:
    verdicts = [
        verdict("a", "2 of 8 GPUs healthy, pod needs 4 whole GPUs"),
        verdict("b", "model T4 not in use list [A100-SXM4-80GB]"),
        verdict("c", "model T4 not in use list [A100-SXM4-80GB]"),
        verdict("d", ok=True),
    ]

    assert summarize(verdicts) == (
        "1/4 nodes are available: 2 node(s): model T4 not in use list [A100-SXM4-80GB]; "
        "1 node(s): 2 of 8 GPUs healthy, pod needs 4 whole GPUs."
    )


def test_summary_of_many_distinct_reasons_is_cut_with_a_count_of_the_rest() -> None:
    verdicts = [verdict(f"n{i}", f"reason {i}") for i in range(8)]

    text = summarize(verdicts)

    assert text.count("node(s):") == 6 and text.endswith("3 node(s): other reasons.")


def test_summary_of_an_invalid_pod_names_the_problem() -> None:
    assert summarize([], pod_error="koordinator.sh/gpu-core=150: over 100") == (
        "pod request is invalid: koordinator.sh/gpu-core=150: over 100"
    )


def test_the_same_message_is_not_posted_twice_within_the_repeat_window() -> None:
    posted: list[tuple[str, dict[str, Any]]] = []
    now = [0.0]
    recorder = EventRecorder(
        sink=lambda ns, body: posted.append((ns, body)),
        clock=lambda: now[0],
        instance="test",
        repeat_after_s=60,
        wall=lambda: datetime(2024, 5, 1, tzinfo=UTC),
    )
    pod = whole_pod("p", namespace="ml")

    first = recorder.failed(pod, "0/1 nodes are available: 1 node(s): full.")
    repeat = recorder.failed(pod, "0/1 nodes are available: 1 node(s): full.")
    now[0] = 61.0
    later = recorder.failed(pod, "0/1 nodes are available: 1 node(s): full.")

    assert (first, repeat, later) == (True, False, True)
    namespace, body = posted[0]
    assert namespace == "ml"
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "ml",
        "uid": pod["metadata"]["uid"],
        "resourceVersion": "",
    }
    assert (body["type"], body["reason"], body["source"]) == ("Warning", "FailedScheduling", {"component": "fgpu-scheduler"})
