"""Hook registrations from a watched directory: format, errors, order, hot reload."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtimeproxy.errors import ConfigError
from runtimeproxy.hookconfig import FailurePolicy, HookRegistry, Stage, parse_duration, parse_file


def write(path: Path, text: str) -> None:
    path.write_text(text)
    # distinct mtimes even on coarse clocks
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_a_file_registers_servers_with_their_stages_policy_and_timeout(tmp_path: Path) -> None:
    write(tmp_path / "10-agent.yaml", """
hooks:
  - name: agent
    endpoint: unix:///run/fgpu/agent.sock
    stages: [PreCreateContainer, PostStopContainer]
    failurePolicy: Ignore
    timeout: 500ms
""")
    (server,) = parse_file(str(tmp_path / "10-agent.yaml"))
    assert server.name == "agent"
    assert server.stages == {Stage.PRE_CREATE_CONTAINER, Stage.POST_STOP_CONTAINER}
    assert server.failure_policy is FailurePolicy.IGNORE
    assert server.timeout_s == 0.5


def test_defaults_are_fail_and_two_seconds(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "name: a\nendpoint: unix:///a.sock\nstages: [PreCreateContainer]\n")
    (server,) = parse_file(str(tmp_path / "a.yaml"))
    assert server.failure_policy is FailurePolicy.FAIL
    assert server.timeout_s == 2.0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("name: a\nendpoint: unix:///a.sock\nstages: [PreCreate]\n", "unknown stage 'PreCreate'"),
        ("name: a\nendpoint: unix:///a.sock\nstages: []\n", "stages=[]"),
        ("name: a\nendpoint: unix://rel\nstages: [PreCreateContainer]\n", "absolute path"),
        ("name: a\nendpoint: unix:///a.sock\nstages: [PreCreateContainer]\nfailurePolicy: Maybe\n", "Fail or Ignore"),
        ("name: a\nendpoint: unix:///a.sock\nstages: [PreCreateContainer]\ntimeout: soon\n", "duration"),
        ("name: a\nendpoint: unix:///a.sock\nstages: [PreCreateContainer]\nretries: 3\n", "unknown field(s) ['retries']"),
        ("endpoint: unix:///a.sock\nstages: [PreCreateContainer]\n", "name=None"),
        ("hooks: {a: 1}\n", "must be a list"),
        ("hooks: [\n", "not valid YAML"),
    ],
)
def test_bad_files_get_errors_naming_file_field_and_fix(tmp_path: Path, body: str, says: str) -> None:
    write(tmp_path / "bad.yaml", body)
    with pytest.raises(ConfigError) as err:
        parse_file(str(tmp_path / "bad.yaml"))
    assert says in str(err.value)
    assert "bad.yaml" in str(err.value)


def test_order_is_file_name_then_entry(tmp_path: Path) -> None:
    write(tmp_path / "20-b.yaml", "hooks:\n" + "".join(
        f"  - {{name: {n}, endpoint: 'unix:///{n}.sock', stages: [PreCreateContainer]}}\n" for n in ("b1", "b2")))
    write(tmp_path / "10-a.yaml", "name: a\nendpoint: unix:///a.sock\nstages: [PreCreateContainer, PreRunPodSandbox]\n")
    write(tmp_path / "notes.txt", "ignored")
    registry = HookRegistry(str(tmp_path))
    assert [s.name for s in registry.servers(Stage.PRE_CREATE_CONTAINER)] == ["a", "b1", "b2"]
    assert [s.name for s in registry.servers(Stage.PRE_RUN_POD_SANDBOX)] == ["a"]
    assert registry.servers(Stage.POST_START_CONTAINER) == ()


def test_reload_picks_up_changes_and_keeps_the_last_good_content_of_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "10-a.yaml"
    write(path, "name: a\nendpoint: unix:///a.sock\nstages: [PreCreateContainer]\n")
    registry = HookRegistry(str(tmp_path))
    assert not registry.refresh()
    write(path, "name: a\nendpoint: unix:///a.sock\nstages: [PreCreateContainer]\ntimeout: 5s\n")
    assert registry.refresh()
    assert registry.servers()[0].timeout_s == 5.0
    write(path, "name: a\nendpoint: [broken\n")
    assert not registry.refresh()
    assert registry.servers()[0].timeout_s == 5.0
    assert "10-a.yaml" in registry.errors
    path.unlink()
    assert registry.refresh()
    assert registry.servers() == ()


def test_duplicate_names_keep_the_first(tmp_path: Path) -> None:
    write(tmp_path / "1.yaml", "name: a\nendpoint: unix:///first.sock\nstages: [PreCreateContainer]\n")
    write(tmp_path / "2.yaml", "name: a\nendpoint: unix:///second.sock\nstages: [PreCreateContainer]\n")
    assert [s.endpoint for s in HookRegistry(str(tmp_path)).servers()] == ["unix:///first.sock"]


def test_a_missing_directory_means_no_hooks(tmp_path: Path) -> None:
    assert HookRegistry(str(tmp_path / "absent")).servers() == ()


@pytest.mark.parametrize(
    ("value", "seconds"), [("2s", 2.0), ("250ms", 0.25), (3, 3.0), ("1.5s", 1.5), ("2m", 120.0), ("1m30s", 90.0)]
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value, field="timeout") == seconds


@pytest.mark.parametrize("value", ["0s", -1, "2x", "25h", True])
def test_bad_durations(value: object) -> None:
    with pytest.raises(ConfigError, match="timeout="):
        parse_duration(value, field="timeout")
