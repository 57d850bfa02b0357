"""The agent's settings: the config file, overridden by command-line flags.

    # /etc/fgpu/agent.yaml (every key optional; defaults shown in docs/agent.md)
    nodeName: gpu-node-1
    hookListen: unix:///var/run/fgpu-agent/hooks.sock
    isolation: hami-core
    signingKey: /etc/fgpu/signing.key
    pollInterval: 1s
    discoveryInterval: 60s
    reportResync: 30s
    admissionSweep: 60s
    admissionSweepGrace: 2m
    runtimeEndpoint: unix:///run/containerd/containerd.sock   # sweep source without Kubernetes
    healthQuietPeriod: 5m
    applicationXids: [13, 31, 43, 45, 68, 109]
    advertiseNvidiaGPU: false
    externalResources: [nvidia.com/gpu, "nvidia.com/mig-*"]
    metricsListen: 0.0.0.0:9400
    isolationPaths: {hamiLibrary: /usr/local/vgpu/libvgpu.so, mpsPipeDir: /run/nvidia/mps}

Unknown keys and bad values are refused with the key, the value and the fix.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from agent.checkpoint import DEFAULT_PATH as DEFAULT_CHECKPOINT_PATH
from agent.errors import ConfigError
from agent.health import DEFAULT_APPLICATION_XIDS
from agent.isolation import Isolation, IsolationPaths
from apis import names
from apis.grpc_server import AddressError, parse_address

#: In a directory of its own, the only host runtime directory the agent gets: /var/run/fgpu holds
#: the runtime proxy's CRI socket (kubelet's endpoint) and admin socket, which the agent must not reach.
DEFAULT_HOOK_LISTEN = "unix:///var/run/fgpu-agent/hooks.sock"
DEFAULT_SIGNING_KEY = "/etc/fgpu/signing.key"


@dataclass(frozen=True)
class AgentConfig:
    node_name: str = ""
    kubeconfig: str = ""
    report_to_kubernetes: bool = True
    hook_listen: str = DEFAULT_HOOK_LISTEN
    isolation: Isolation = Isolation.HAMI_CORE
    isolation_paths: IsolationPaths = field(default_factory=IsolationPaths)
    fake_nvml: str = ""
    signing_key: str = DEFAULT_SIGNING_KEY
    scheduler: str = ""
    metrics_listen: str = "0.0.0.0:9400"
    poll_interval_s: float = 1.0
    discovery_interval_s: float = 60.0
    report_resync_s: float = 30.0
    #: How often admitted pods that are gone or finished are released (needs Kubernetes or runtime_endpoint).
    admission_sweep_s: float = 60.0
    #: Entries younger than this are never swept: the API may not list a just-admitted pod yet.
    admission_sweep_grace_s: float = 120.0
    #: The container runtime's CRI socket; without Kubernetes, the sweep lists its pod sandboxes.
    runtime_endpoint: str = ""
    health_quiet_period_s: float = 300.0
    application_xids: frozenset[int] = DEFAULT_APPLICATION_XIDS
    advertise_nvidia_gpu: bool = False
    #: A trailing "*" matches by prefix: every MIG profile the device plugin may advertise.
    external_resources: tuple[str, ...] = (names.NVIDIA_GPU, names.NVIDIA_MIG_RESOURCE_PREFIX + "*")
    checkpoint_path: str = DEFAULT_CHECKPOINT_PATH
    proc_root: str = "/proc"
    sysfs_root: str = "/sys"
    nvml_retry_max_s: float = 60.0


_KEYS: dict[str, str] = {
    "nodeName": "node_name",
    "kubeconfig": "kubeconfig",
    "reportToKubernetes": "report_to_kubernetes",
    "hookListen": "hook_listen",
    "isolation": "isolation",
    "isolationPaths": "isolation_paths",
    "fakeNvml": "fake_nvml",
    "signingKey": "signing_key",
    "scheduler": "scheduler",
    "metricsListen": "metrics_listen",
    "pollInterval": "poll_interval_s",
    "discoveryInterval": "discovery_interval_s",
    "reportResync": "report_resync_s",
    "admissionSweep": "admission_sweep_s",
    "admissionSweepGrace": "admission_sweep_grace_s",
    "runtimeEndpoint": "runtime_endpoint",
    "healthQuietPeriod": "health_quiet_period_s",
    "applicationXids": "application_xids",
    "advertiseNvidiaGPU": "advertise_nvidia_gpu",
    "externalResources": "external_resources",
    "checkpointPath": "checkpoint_path",
    "procRoot": "proc_root",
    "sysfsRoot": "sysfs_root",
    "nvmlRetryMax": "nvml_retry_max_s",
}
_PATH_KEYS = {
    "hamiLibrary": "hami_library",
    "hamiPreload": "hami_preload",
    "hamiCacheRoot": "hami_cache_root",
    "hamiLockDir": "hami_lock_dir",
    "hamiContainerDir": "hami_container_dir",
    "mpsPipeDir": "mps_pipe_dir",
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def load_config_file(path: str) -> AgentConfig:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read it ({err.strerror}); pass an existing file") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path}: not valid YAML ({err})") from err
    return parse_config(data or {}, source=path)


def parse_config(data: object, *, source: str = "config", base: AgentConfig | None = None) -> AgentConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    values: dict[str, Any] = {}
    for key, raw in data.items():
        attr = _attr_for(key, _KEYS, where=source)
        values[attr] = _convert(attr, raw, where=f"{source}: {key}")
    config = replace(base or AgentConfig(), **values)
    validate(config, source=source)
    return config


def with_overrides(config: AgentConfig, **overrides: Any) -> AgentConfig:
    """`config` with the flags that were given (None means "not given")."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if "isolation" in given and isinstance(given["isolation"], str):
        given["isolation"] = _isolation(given["isolation"], "--isolation")
    out = replace(config, **given)
    validate(out, source="flags")
    return out


def resolve_node_name(config: AgentConfig, *, environ: Mapping[str, str] = os.environ) -> str:
    """--node-name / nodeName, then the downward-API variable, then the hostname."""
    return config.node_name or environ.get(names.NODE_NAME_ENV, "") or socket.gethostname()


def validate(config: AgentConfig, *, source: str) -> None:
    for attr in ("poll_interval_s", "discovery_interval_s", "report_resync_s", "nvml_retry_max_s", "admission_sweep_s"):
        if getattr(config, attr) <= 0:
            raise ConfigError(f"{source}: {attr} = {getattr(config, attr)} must be more than 0 seconds")
    if config.admission_sweep_grace_s < 0:
        raise ConfigError(
            f"{source}: admissionSweepGrace = {config.admission_sweep_grace_s} must be 0 seconds or more (default 2m)"
        )
    try:
        parse_address(config.hook_listen, field="hookListen")
        if config.scheduler:
            parse_address(config.scheduler, field="scheduler")
    except AddressError as err:
        raise ConfigError(f"{source}: {err}") from err
    if config.runtime_endpoint:
        try:
            parse_address(config.runtime_endpoint, field="runtimeEndpoint")
        except AddressError:
            raise ConfigError(
                f"{source}: runtimeEndpoint={config.runtime_endpoint!r} is not a CRI endpoint; write the runtime's "
                "socket as kubelet's --container-runtime-endpoint, e.g. unix:///run/containerd/containerd.sock, "
                "or leave it empty"
            ) from None
    if config.metrics_listen:
        _host, sep, port = config.metrics_listen.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"{source}: metricsListen={config.metrics_listen!r} must be HOST:PORT (e.g. 0.0.0.0:9400) or empty")


def _convert(attr: str, raw: object, *, where: str) -> Any:
    default = getattr(AgentConfig(), attr)
    if attr == "isolation":
        return _isolation(str(raw), where)
    if attr == "isolation_paths":
        return _paths(raw, where)
    if attr.endswith("_s"):
        return parse_duration(raw, where=where)
    if attr == "application_xids":
        if not isinstance(raw, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
            raise ConfigError(f"{where}={raw!r} must be a list of Xid numbers, e.g. [13, 31, 43]")
        return frozenset(raw)
    if attr == "external_resources":
        if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
            raise ConfigError(f"{where}={raw!r} must be a list of resource names, e.g. [{names.NVIDIA_GPU}]")
        return tuple(raw)
    if isinstance(default, bool):
        if not isinstance(raw, bool):
            raise ConfigError(f"{where}={raw!r} must be true or false")
        return raw
    if not isinstance(raw, str):
        raise ConfigError(f"{where}={raw!r} must be text")
    return raw


def parse_duration(raw: object, *, where: str) -> float:
    if isinstance(raw, bool):
        raise ConfigError(f"{where}={raw!r} is not a duration; write e.g. 1s, 500ms or 5m")
    if isinstance(raw, int | float):
        return float(raw)
    match = _DURATION.match(str(raw))
    if match is None:
        raise ConfigError(f"{where}={raw!r} is not a duration; write e.g. 1s, 500ms or 5m")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _isolation(value: str, where: str) -> Isolation:
    try:
        return Isolation.parse(value, field=where)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _paths(raw: object, where: str) -> IsolationPaths:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping, e.g. {{hamiLibrary: /usr/local/vgpu/libvgpu.so}}")
    values: dict[str, str] = {}
    for key, value in raw.items():
        attr = _attr_for(key, _PATH_KEYS, where=where)
        if not isinstance(value, str) or not value.startswith("/"):
            raise ConfigError(f"{where}.{key}={value!r} must be an absolute path")
        values[attr] = value
    return replace(IsolationPaths(), **values)


def _attr_for(key: object, table: Mapping[str, str], *, where: str) -> str:
    attr = table.get(str(key))
    if attr is None:
        raise ConfigError(f"{where}: unknown key {key!r}; known keys are {', '.join(sorted(table))}")
    return attr
