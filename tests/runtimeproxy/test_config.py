"""The proxy's settings: defaults, the YAML file, flags over it, and errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtimeproxy import config
from runtimeproxy.errors import ConfigError
from runtimeproxy.main import build_parser


def test_defaults_fit_a_gpu_node() -> None:
    cfg = config.ProxyConfig()
    assert cfg.listen == "unix:///var/run/fgpu/runtimeproxy.sock"
    assert cfg.backend == "unix:///run/containerd/containerd.sock"
    assert cfg.socket_mode == 0o660
    assert cfg.force_void is True


def test_file_settings_and_flags_over_them(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(
        "listen: unix:///tmp/x.sock\nbackend: unix:///tmp/ctrd.sock\nsocketMode: '0600'\nforceVoid: false\n"
        "hookServerNamespaces: [gpu-system]\nbackendDialTimeout: 3s\nmetricsListen: ''\n"
    )
    args = build_parser().parse_args(["--config", str(path), "--backend", "unix:///tmp/other.sock", "--force-void", "true"])
    cfg = config.from_args(args)
    assert cfg.listen == "unix:///tmp/x.sock"
    assert cfg.backend == "unix:///tmp/other.sock"
    assert cfg.socket_mode == 0o600
    assert cfg.force_void is True
    assert cfg.hook_server_namespaces == ("gpu-system",)
    assert cfg.backend_dial_timeout_s == 3.0
    assert cfg.metrics_listen == ""


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"listen": "unix://relative.sock"}, "absolute path"),
        ({"backend": "nowhere"}, "expected unix:///PATH or HOST:PORT"),
        ({"socketMode": "rw-rw----"}, "octal mode"),
        ({"forceVoid": "yes"}, "forceVoid='yes': expected true or false"),
        ({"metricsListen": "9466"}, "HOST:PORT"),
        ({"logFormat": "xml"}, "text or json"),
        ({"listenAddress": "x"}, "unknown key(s) ['listenAddress']"),
        ({"backendDialTimeout": "0s"}, "more than zero"),
    ],
)
def test_bad_settings_name_the_key_the_value_and_the_fix(data: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.from_mapping(data, source="proxy.yaml")
    assert says in str(err.value)
    assert "proxy.yaml" in str(err.value)


def test_unknown_socket_group_is_refused() -> None:
    cfg = config.ProxyConfig(socket_group="no-such-group-fgpu")
    with pytest.raises(ConfigError, match="socketGroup='no-such-group-fgpu'"):
        cfg.socket_gid()


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        config.load_file(str(tmp_path / "absent.yaml"))
