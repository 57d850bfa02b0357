from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_plugin import main as cli
from scheduler_plugin.config import ConfigError, StateBackend, from_mapping, load_file, with_overrides


def test_a_config_file_is_read_and_flags_override_it(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("state: embedded\ndb: /tmp/x.db\npolicy: spread\nleaderElection:\n  leaseDurationSeconds: 30\n")

    config = with_overrides(load_file(str(path)), policy="binpack", db=None)

    assert (config.state, config.db, config.policy) == (StateBackend.EMBEDDED, "/tmp/x.db", "binpack")
    assert config.leader_election.lease_duration_s == 30.0


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"polcy": "binpack"}, "unknown key 'polcy'; valid keys are"),
        ({"state": "etcd"}, "state='etcd': unknown state backend; use one of kubernetes, embedded"),
        ({"standalone": "yes"}, "standalone='yes': expected true or false"),
        ({"assumeTTLSeconds": 0}, "assumeTTLSeconds=0.0: must be > 0"),
        ({"leaderElection": {"renewDeadlineSeconds": 20}}, "renewDeadlineSeconds < leaseDurationSeconds"),
        ({"state": "embedded", "standalone": True}, "use --state kubernetes, or drop --standalone"),
    ],
)
def test_bad_config_is_refused_naming_key_value_and_fix(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_mapping(data)

    assert needle in str(caught.value)


def test_the_command_line_refuses_an_unknown_policy_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--policy", "best-ever", "--state", "embedded", "--db", "/tmp/unused.db"])

    err = capsys.readouterr().err
    assert code == 2
    assert "--policy='best-ever': unknown policy; choose one of" in err and "binpack" in err


def test_the_command_line_reports_a_missing_signing_key_and_exits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--state", "embedded", "--db", str(tmp_path / "s.db"), "--grpc-listen", "", "--signing-key", str(tmp_path / "nokey")])

    assert code == 1
    assert "signing key file" in capsys.readouterr().err
