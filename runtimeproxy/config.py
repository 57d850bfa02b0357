"""The proxy's settings: defaults fit for a GPU node, a YAML file, and flags over both.

    # /etc/fgpu/runtime-proxy.yaml (every key optional)
    listen: unix:///var/run/fgpu/runtimeproxy.sock
    backend: unix:///run/containerd/containerd.sock
    hookConfigDir: /etc/fgpu/hooks.d
    adminListen: unix:///var/run/fgpu/runtimeproxy-admin.sock
    metricsListen: 127.0.0.1:9466          # "" turns the HTTP metrics endpoint off
    socketMode: "0660"
    socketGroup: ""                        # group name or gid owning the listen socket
    forceVoid: true                        # NVIDIA_VISIBLE_DEVICES=void unless a hook set it
    hookServerNamespaces: [fgpu-system, kube-system]   # where the hook-server label is honoured; [] = nowhere, ["*"] = any
    backendDialTimeout: 10s
    hookRefreshInterval: 1s
    lookupTimeout: 5s
    logLevel: info
    logFormat: text                        # or json
"""

from __future__ import annotations

import argparse
import dataclasses
import grp
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apis import config_paths, config_yaml, hostport
from apis.grpc_server import AddressError, parse_address
from runtimeproxy.errors import ConfigError
from runtimeproxy.hookconfig import parse_duration


@dataclass(frozen=True)
class ProxyConfig:
    listen: str = "unix:///var/run/fgpu/runtimeproxy.sock"
    backend: str = "unix:///run/containerd/containerd.sock"
    hook_config_dir: str = "/etc/fgpu/hooks.d"
    admin_listen: str = "unix:///var/run/fgpu/runtimeproxy-admin.sock"
    metrics_listen: str = "127.0.0.1:9466"
    socket_mode: int = 0o660
    socket_group: str = ""
    force_void: bool = True
    hook_server_namespaces: tuple[str, ...] = ("fgpu-system", "kube-system")
    backend_dial_timeout_s: float = 10.0
    hook_refresh_s: float = 1.0
    lookup_timeout_s: float = 5.0
    log_level: str = "info"
    log_format: str = "text"

    def socket_gid(self) -> int | None:
        """The gid for the listen socket, from a group name or number; None keeps the default."""
        if not self.socket_group:
            return None
        if self.socket_group.isdigit():
            return int(self.socket_group)
        try:
            return grp.getgrnam(self.socket_group).gr_gid
        except KeyError:
            raise ConfigError(
                f"socketGroup={self.socket_group!r}: no such group; create it or give a numeric gid"
            ) from None


#: config-file key -> (dataclass field, kind)
_KEYS: dict[str, tuple[str, str]] = {
    "listen": ("listen", "address"),
    "backend": ("backend", "address"),
    "hookConfigDir": ("hook_config_dir", "abspath"),
    "adminListen": ("admin_listen", "address?"),
    "metricsListen": ("metrics_listen", "hostport?"),
    "socketMode": ("socket_mode", "mode"),
    "socketGroup": ("socket_group", "str"),
    "forceVoid": ("force_void", "bool"),
    "hookServerNamespaces": ("hook_server_namespaces", "list"),
    "backendDialTimeout": ("backend_dial_timeout_s", "duration"),
    "hookRefreshInterval": ("hook_refresh_s", "duration"),
    "lookupTimeout": ("lookup_timeout_s", "duration"),
    "logLevel": ("log_level", "level"),
    "logFormat": ("log_format", "format"),
}


#: what a message suggests for each duration key: its default
_DURATION_EXAMPLES = {"backendDialTimeout": "10s", "hookRefreshInterval": "1s", "lookupTimeout": "5s"}


def _convert(key: str, kind: str, value: Any) -> Any:
    where = f"{key}={value!r}"
    if kind in ("address", "address?"):
        if value in ("", None) and kind == "address?":
            return ""
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected unix:///PATH or HOST:PORT")
        try:
            parse_address(value, field=key)
        except AddressError as exc:
            raise ConfigError(str(exc)) from exc
        return value
    if kind == "hostport?":
        if value in ("", None):
            return ""
        if not isinstance(value, str) or not hostport.is_listen_hostport(value):
            raise ConfigError(
                f"{where}: expected HOST:PORT with a port up to 65535, such as 127.0.0.1:9466 ([::1]:9466 for "
                "IPv6), or \"\" to turn metrics off"
            )
        return value
    if kind == "abspath":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: expected an absolute directory path, e.g. /etc/fgpu/hooks.d")
        try:
            # Flags too: the proxy re-reads this directory every hookRefreshInterval, for as long as it runs.
            return config_paths.absolute(value, field=key, example="/etc/fgpu/hooks.d")
        except config_paths.PathError as exc:
            raise ConfigError(str(exc)) from None
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string")
        return value
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{where}: expected true or false")
    if kind == "list":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of namespace names, e.g. [fgpu-system]")
        return tuple(value)
    if kind == "duration":
        return parse_duration(value, field=key, example=_DURATION_EXAMPLES[key])
    if kind == "mode":
        # A bool is an int and a float truncates (0.5 -> 0): neither is a mode anyone meant.
        if isinstance(value, str):
            try:
                mode = int(value, 8)
            except ValueError:
                raise ConfigError(f"{where}: expected an octal mode such as \"0660\"") from None
        elif isinstance(value, int) and not isinstance(value, bool):
            mode = value
        else:
            raise ConfigError(f"{where}: expected an octal mode such as \"0660\"")
        if not 0 <= mode <= 0o777:
            raise ConfigError(f"{where}: expected an octal mode such as \"0660\"")
        return mode
    if kind == "level":
        if str(value).lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"{where}: expected debug, info, warning or error")
        return str(value).lower()
    if kind == "format":
        if value not in ("text", "json"):
            raise ConfigError(f"{where}: expected text or json")
        return value
    raise AssertionError(kind)


def from_mapping(data: Mapping[str, Any], *, base: ProxyConfig | None = None, source: str = "config") -> ProxyConfig:
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown}; known keys: {sorted(_KEYS)}")
    changes = {}
    for key, value in data.items():
        name, kind = _KEYS[key]
        try:
            changes[name] = _convert(key, kind, value)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return dataclasses.replace(base or ProxyConfig(), **changes)


def load_file(path: str) -> ProxyConfig:
    try:
        doc = config_yaml.load_file(path)
    except config_yaml.YAMLFileError as exc:
        raise ConfigError(f"--config {exc}") from None
    if doc is None:
        return ProxyConfig()
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(doc).__name__}")
    return from_mapping(doc, source=path)


#: flag dest -> config-file key
_FLAGS = {
    "listen": "listen",
    "backend": "backend",
    "hook_config_dir": "hookConfigDir",
    "admin_listen": "adminListen",
    "metrics_listen": "metricsListen",
    "socket_mode": "socketMode",
    "socket_group": "socketGroup",
    "force_void": "forceVoid",
    "hook_server_namespaces": "hookServerNamespaces",
    "backend_dial_timeout": "backendDialTimeout",
    "log_level": "logLevel",
    "log_format": "logFormat",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file with any of the settings below (flags win)")
    parser.add_argument("--listen", help="where kubelet connects, e.g. unix:///var/run/fgpu/runtimeproxy.sock")
    parser.add_argument("--backend", help="the real runtime, e.g. unix:///run/containerd/containerd.sock")
    parser.add_argument("--hook-config-dir", help="directory of hook server registrations (YAML)")
    parser.add_argument("--admin-listen", help="gRPC health and reflection socket; \"\" turns it off")
    parser.add_argument("--metrics-listen", help="HOST:PORT of the Prometheus endpoint; \"\" turns it off")
    parser.add_argument("--socket-mode", help="octal mode of the listen socket (default 0660)")
    parser.add_argument("--socket-group", help="group name or gid owning the listen socket")
    parser.add_argument("--force-void", choices=("true", "false"), help="NVIDIA_VISIBLE_DEVICES=void unless a hook set it")
    parser.add_argument("--hook-server-namespaces", help="comma-separated namespaces where the hook-server label counts")
    parser.add_argument("--backend-dial-timeout", help="how long to retry dialing the runtime, e.g. 10s")
    parser.add_argument("--log-level", help="debug, info, warning or error")
    parser.add_argument("--log-format", help="text or json")


def from_args(args: argparse.Namespace) -> ProxyConfig:
    base = load_file(args.config) if getattr(args, "config", None) else ProxyConfig()
    overrides = {key: getattr(args, dest) for dest, key in _FLAGS.items() if getattr(args, dest, None) is not None}
    return from_mapping(overrides, base=base, source="flags")
