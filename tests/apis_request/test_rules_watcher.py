"""Hot reload: the rules follow the file, and a bad edit keeps the last good rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from apis.translation import RulesError, RulesWatcher

RULES_A = "version: 1\nrules:\n  - name: alpha\n    count: {resource: a.example/gpu}\n"
RULES_B = "version: 1\nrules:\n  - name: beta\n    count: {resource: b.example/gpu}\n"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, text: str, *, mtime_ns: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))  # distinct mtimes even on coarse-clock filesystems


def names_of(watcher: RulesWatcher) -> list[str]:
    return [r.name for r in watcher.current().rules]


def test_a_changed_file_is_picked_up(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    write(path, RULES_A, mtime_ns=1_000_000_000)
    watcher = RulesWatcher(str(path), min_interval_s=0)
    assert names_of(watcher) == ["alpha"]
    write(path, RULES_B, mtime_ns=2_000_000_000)
    assert names_of(watcher) == ["beta"]
    assert watcher.reloads == 1


def test_a_bad_edit_keeps_the_last_good_rules_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    write(path, RULES_A, mtime_ns=1_000_000_000)
    watcher = RulesWatcher(str(path), min_interval_s=0)
    write(path, "version: 1\nrules:\n  - name: Bad!\n", mtime_ns=2_000_000_000)
    assert names_of(watcher) == ["alpha"]
    assert watcher.last_error is not None and "'Bad!' is not a valid rule name" in watcher.last_error
    write(path, RULES_B, mtime_ns=3_000_000_000)
    assert names_of(watcher) == ["beta"]
    assert watcher.last_error is None


def test_a_file_that_disappears_keeps_the_last_good_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    write(path, RULES_A, mtime_ns=1_000_000_000)
    watcher = RulesWatcher(str(path), min_interval_s=0)
    path.unlink()
    assert names_of(watcher) == ["alpha"]
    assert watcher.last_error is not None and "cannot read" in watcher.last_error


def test_a_configmap_style_symlink_swap_is_picked_up(tmp_path: Path) -> None:
    first, second = tmp_path / "..v1", tmp_path / "..v2"
    first.mkdir()
    second.mkdir()
    write(first / "rules.yaml", RULES_A, mtime_ns=1_000_000_000)
    write(second / "rules.yaml", RULES_B, mtime_ns=1_000_000_000)  # same mtime: only the inode differs
    data = tmp_path / "..data"
    data.symlink_to(first.name)
    watcher = RulesWatcher(str(data / "rules.yaml"), min_interval_s=0)
    assert names_of(watcher) == ["alpha"]
    tmp_link = tmp_path / "..data_tmp"
    tmp_link.symlink_to(second.name)
    tmp_link.replace(data)
    assert names_of(watcher) == ["beta"]


def test_the_file_is_looked_at_no_more_often_than_the_interval(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    write(path, RULES_A, mtime_ns=1_000_000_000)
    clock = FakeClock()
    watcher = RulesWatcher(str(path), min_interval_s=5.0, clock=clock)
    write(path, RULES_B, mtime_ns=2_000_000_000)
    clock.now = 4.9
    assert names_of(watcher) == ["alpha"]
    clock.now = 5.0
    assert names_of(watcher) == ["beta"]


def test_a_bad_file_at_start_is_an_error_to_fix_now(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("version: 7\nrules: []\n")
    with pytest.raises(RulesError, match="version: 7 is not supported"):
        RulesWatcher(str(path))
