"""Reasons and Events repeat pod authors' lists and text: bounded in count, in bytes, and cut visibly."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler_plugin.core.api import LabelRequirement, NodeName
from scheduler_plugin.core.reasons import listed
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.events import MESSAGE_MAX_BYTES, event_body, fit_message
from tests.scheduler_core.builders import info, node, pod, share


@pytest.mark.parametrize(
    ("items", "text"),
    [
        ([], ""),
        (["A"], "A"),
        (["A", "B", "C"], "A, B, C"),
        (["A", "B", "C", "D"], "A, B, C and 1 more"),
        ([f"M{i}" for i in range(20)], "M0, M1, M2 and 17 more"),
    ],
)
def test_listed_names_three_and_counts_the_rest(items: list[str], text: str) -> None:
    assert listed(items) == text


def _verdict(request: object, *, labels: dict[str, str] | None = None) -> str:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("n1", 4, model="T4", memory_gib=16))
    if labels is not None:
        scheduler.upsert_node_info(info("n1", labels=labels))
    [verdict] = scheduler.filter(request, [NodeName("n1")])  # type: ignore[arg-type]
    assert not verdict.feasible
    return verdict.reason


def test_use_and_avoid_lists_are_named_up_to_three() -> None:
    use = [f"A{i:03d}" for i in range(500)]
    assert _verdict(pod("p", share(10), use=use)) == "model T4 not in use list [A000, A001, A002 and 497 more]"
    assert _verdict(pod("p", share(10), avoid=["T4", "A100", "B200", "H100"])) == (
        "model T4 in avoid list [A100, B200, H100 and 1 more]"
    )


def test_node_affinity_values_are_named_up_to_three() -> None:
    values = tuple(f"z{i}" for i in range(1000))
    reason = _verdict(pod("p", share(10), affinity=[[LabelRequirement("zone", "In", values)]]), labels={"zone": "c"})
    assert reason == "node matches none of the pod's required node affinity terms (unmet: zone In ['z0', 'z1', 'z2' and 997 more])"


@pytest.mark.parametrize("char", ["a", "\u00e9", "\u754c", "\U0001f600"])  # 1, 2, 3 and 4 bytes in UTF-8
def test_a_message_is_cut_to_the_byte_limit_at_a_character_boundary(char: str) -> None:
    cut = fit_message("x" + char * 2000)
    data = cut.encode()  # a split character would not round-trip
    assert len(data) <= MESSAGE_MAX_BYTES and len(data) > MESSAGE_MAX_BYTES - 8
    assert cut.endswith("\u2026") and cut.startswith("x" + char)
    assert set(cut[1:-1]) == {char}


def test_a_message_that_fits_is_sent_whole() -> None:
    exact = "\u754c" * (MESSAGE_MAX_BYTES // 3) + "a"  # 1024 bytes, 342 characters
    assert fit_message(exact) == exact
    body = event_body(pod={"metadata": {"name": "p", "namespace": "team"}}, reason="FailedScheduling", message=exact,
                      warning=True, instance="s-0", now=datetime.now(UTC))
    assert body["message"] == exact
    assert fit_message(exact + "b") != exact + "b"
