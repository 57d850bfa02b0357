"""Merging hook edits into what a request already holds."""

from __future__ import annotations

import pytest

from runtimeproxy.edits import Edits, ResourceEdit, merge_annotations, merge_by_key, merge_env, merge_names


@pytest.mark.parametrize(
    ("current", "set_envs", "unset", "expected"),
    [
        pytest.param([("A", "1"), ("B", "2")], [("B", "x")], [], [("A", "1"), ("B", "x")], id="replaces in place"),
        pytest.param([("A", "1")], [("C", "3")], [], [("A", "1"), ("C", "3")], id="appends new"),
        pytest.param([("A", "1"), ("B", "2")], [], ["A"], [("B", "2")], id="unsets"),
        pytest.param([("A", "1")], [("A", "2")], ["A"], [("A", "2")], id="set wins over unset of the same name"),
        pytest.param([("A", "1"), ("B", "2"), ("A", "3")], [("A", "x")], [], [("A", "x"), ("B", "2")],
                     id="duplicate names collapse onto the first"),
        pytest.param([("A", "1"), ("A", "3")], [], [], [("A", "1"), ("A", "3")], id="untouched duplicates stay"),
        pytest.param([], [("A", "1"), ("A", "2")], [], [("A", "2")], id="last of repeated sets wins"),
    ],
)
def test_env_merge_keeps_everything_it_was_not_asked_to_change(
    current: list[tuple[str, str]], set_envs: list[tuple[str, str]], unset: list[str], expected: list[tuple[str, str]]
) -> None:
    assert merge_env(current, set_envs=set_envs, unset=set(unset)) == expected


def test_mounts_with_the_same_container_path_are_replaced_not_duplicated() -> None:
    current = [("/a", "host-a"), ("/b", "host-b")]
    added = [("/b", "new-b"), ("/c", "host-c")]
    merged = merge_by_key(current, added, key=lambda m: m[0])
    assert merged == [("/a", "host-a"), ("/b", "new-b"), ("/c", "host-c")]


def test_cdi_names_are_deduplicated_in_order() -> None:
    assert merge_names(["nvidia.com/gpu=0"], ["nvidia.com/gpu=1", "nvidia.com/gpu=0"]) == [
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=1",
    ]


def test_annotations_are_removed_then_set() -> None:
    got = merge_annotations({"a": "1", "b": "2"}, set_annotations=[("c", "3"), ("a", "9")], remove={"b", "a"})
    assert got == {"a": "9", "c": "3"}


def test_edit_counts_name_each_kind() -> None:
    edits = Edits(set_envs=(("A", "1"),), unset_envs=("B",), resources=ResourceEdit(cpu_shares=2))
    assert edits.counts() == {"env": 2, "mount": 0, "device": 0, "cdi": 0, "annotation": 0, "resources": 1}
    assert Edits().counts()["resources"] == 0
