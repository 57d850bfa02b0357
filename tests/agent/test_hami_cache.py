"""The HAMi cache directories of pods that are gone are removed, whoever missed their PostStopPodSandbox."""

from __future__ import annotations

import os

from agent.isolation import hami_cache


def test_only_directories_of_pods_no_longer_live_are_orphans() -> None:
    names = ["uid-a_main", "uid-a_side", "uid-b_main", "not-ours", "_x"]
    assert hami_cache.orphaned(names, live_uids={"uid-a"}) == ["uid-b_main"]


def test_orphans_older_than_the_grace_are_removed_and_fresh_ones_kept(tmp_path: object) -> None:
    root = str(tmp_path)
    for name in ("gone_main", "live_main", "fresh_main"):
        os.makedirs(os.path.join(root, name))
    old = 1_000_000.0
    os.utime(os.path.join(root, "gone_main"), (old, old))
    os.utime(os.path.join(root, "live_main"), (old, old))
    now = os.stat(os.path.join(root, "fresh_main")).st_mtime + 1

    removed = hami_cache.remove_orphans(root, live_uids={"live"}, min_age_s=60, now=now)

    assert removed == ["gone_main"]
    assert sorted(os.listdir(root)) == ["fresh_main", "live_main"]


def test_a_missing_root_removes_nothing() -> None:
    assert hami_cache.remove_orphans("/nonexistent/fgpu-cache", live_uids=set(), min_age_s=0) == []
