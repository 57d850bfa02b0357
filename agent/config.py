"""The agent's settings: the config file, overridden by command-line flags.

    # /etc/fgpu/agent.yaml (every key optional; defaults shown in docs/agent.md)
    nodeName: gpu-node-1
    hookListen: unix:///var/run/fgpu-agent/hooks.sock
    stateDir: ""                 # node-local state (the MIG record); default: hookListen's directory
    isolation: hami-core
    verifyingKeys: /etc/fgpu/verifying-keys   # public keys (a directory or a PEM file), re-read on change
    legacySigningKey: ""                     # the v1 HMAC key, only during the upgrade window
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
    scheduler: ""                # ReportDevices to an embedded-state scheduler: unix:///PATH or HOST:PORT
    schedulerTLS: {caFile: /etc/fgpu/tls/ca.crt, certFile: /etc/fgpu/tls/agent.crt, keyFile: /etc/fgpu/tls/agent.key}
                                 # mutual TLS to a scheduler beyond loopback (serverName: to check another name)
    overcommit: ""               # the pool's overcommit settings file (docs/overcommit.md); empty: no reclaim

Unknown keys and bad values are refused with the key, the value and the fix.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agent.checkpoint import DEFAULT_PATH as DEFAULT_CHECKPOINT_PATH
from agent.errors import ConfigError
from agent.health import DEFAULT_APPLICATION_XIDS
from agent.isolation import registry
from agent.isolation.registry import IsolationPaths
from apis import config_paths, config_yaml, durations, hostport, names, tls
from apis.grpc_server import AddressError, parse_address
from apis.tls import TLSFiles

#: In a directory of its own, the only host runtime directory the agent gets: /var/run/fgpu holds
#: the runtime proxy's CRI socket (kubelet's endpoint) and admin socket, which the agent must not reach.
DEFAULT_HOOK_LISTEN = "unix:///var/run/fgpu-agent/hooks.sock"
#: Where node-local state lives when hookListen is not a unix socket. Under /var/run on purpose:
#: the MIG record must not outlive a reboot, and neither do the MIG instances it lists.
DEFAULT_STATE_DIR = "/var/run/fgpu-agent"
#: fgpu's record of the MIG instances it created (agent/mig_nvml.py), in the state directory.
MIG_RECORD_FILE = "mig-instances.json"
#: The agent's record of its unhealthy GPUs (agent/health_record.py), in the state directory.
HEALTH_RECORD_FILE = "gpu-health.json"
#: Public keys only: a node never holds what signs allocations (apis/signing.py).
DEFAULT_VERIFYING_KEYS = "/etc/fgpu/verifying-keys"


@dataclass(frozen=True)
class AgentConfig:
    node_name: str = ""
    kubeconfig: str = ""
    report_to_kubernetes: bool = True
    hook_listen: str = DEFAULT_HOOK_LISTEN
    #: Node-local state (the MIG record); "" means hook_listen's directory (`state_dir`).
    state_dir: str = ""
    #: a registered isolation backend's name (agent/isolation/)
    isolation: str = names.ISOLATION_HAMI_CORE
    isolation_paths: IsolationPaths = field(default_factory=IsolationPaths)
    fake_nvml: str = ""
    #: The public keys allocation signatures are checked with: a PEM file or a directory of them.
    verifying_keys: str = DEFAULT_VERIFYING_KEYS
    #: The v1 HMAC key of fgpu before v2 signatures; empty, missing or an empty file: v1 refused.
    legacy_signing_key: str = ""
    scheduler: str = ""
    #: client certificate, key and the CA of the scheduler's certificate, for a TCP scheduler address
    scheduler_tls: TLSFiles = field(default_factory=TLSFiles)
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
    #: The node pool's overcommit settings file (agent/reclaim_settings.py), re-read on change;
    #: "" runs no reclaim and removes the node's burstable-ratio label (agent/reclaim_service.py).
    overcommit: str = ""


_KEYS: dict[str, str] = {
    "nodeName": "node_name",
    "kubeconfig": "kubeconfig",
    "reportToKubernetes": "report_to_kubernetes",
    "hookListen": "hook_listen",
    "stateDir": "state_dir",
    "isolation": "isolation",
    "isolationPaths": "isolation_paths",
    "fakeNvml": "fake_nvml",
    "verifyingKeys": "verifying_keys",
    "legacySigningKey": "legacy_signing_key",
    "scheduler": "scheduler",
    "schedulerTLS": "scheduler_tls",
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
    "overcommit": "overcommit",
}
_TLS_KEYS = {"caFile": "ca_file", "certFile": "cert_file", "keyFile": "key_file", "serverName": "server_name"}
#: Intervals and timers: 0 would spin a loop. A year is longer than any sensible value and far below
#: what a timer accepts; a value past it is a typo that would raise OverflowError in a running daemon.
_RUNS = durations.Bounds(maximum=durations.YEAR)
#: Graces and quiet periods: 0 means "none".
_GRACE = durations.Bounds(maximum=durations.YEAR, zero=True)
#: field -> (bounds, example for messages)
_DURATIONS: dict[str, tuple[durations.Bounds, str]] = {
    "poll_interval_s": (_RUNS, "1s"),
    "discovery_interval_s": (_RUNS, "60s"),
    "report_resync_s": (_RUNS, "30s"),
    "admission_sweep_s": (_RUNS, "60s"),
    "nvml_retry_max_s": (_RUNS, "60s"),
    "admission_sweep_grace_s": (_GRACE, "2m"),
    "health_quiet_period_s": (_GRACE, "5m"),
}
#: Files the config names, with an example of each: read by a daemon whose working directory is `/`.
_PATH_EXAMPLES: dict[str, str] = {
    "fake_nvml": "/etc/fgpu/inventory.yaml",
    "verifying_keys": DEFAULT_VERIFYING_KEYS,
    "legacy_signing_key": "/etc/fgpu/legacy/signing-key",
    "checkpoint_path": DEFAULT_CHECKPOINT_PATH,
    "kubeconfig": "/etc/fgpu/kubeconfig",
    "proc_root": "/host/proc",
    "sysfs_root": "/host/sys",
}


def load_config_file(path: str) -> AgentConfig:
    try:
        data = config_yaml.load_file(path)
    except config_yaml.YAMLFileError as err:
        raise ConfigError(f"--config {err}") from None
    return parse_config({} if data is None else data, source=path)


def parse_config(data: object, *, source: str = "config", base: AgentConfig | None = None) -> AgentConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if key == "signingKey":
            # Said apart from an unknown key: a config from before v2 signatures must learn what changed.
            raise ConfigError(
                f"{source}: signingKey={raw!r} is no longer read: nodes check allocation signatures with the "
                "scheduler's public keys now; set verifyingKeys to them (`fgpuctl keys public`) and, during "
                "the upgrade window only, legacySigningKey to this old cluster key file (docs/deploy.md)"
            )
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


def state_dir(config: AgentConfig) -> str:
    """The node-local state directory: `stateDir`, else the hook socket's directory, which a node
    already gives the agent (a hostPath in the DaemonSet) and which lives exactly as long as the
    node's boot, as MIG instances do."""
    if config.state_dir:
        return config.state_dir
    try:
        socket_path = parse_address(config.hook_listen, field="hookListen").unix_path
    except AddressError:
        socket_path = None
    return (os.path.dirname(socket_path) or ".") if socket_path else DEFAULT_STATE_DIR


def mig_record_path(config: AgentConfig) -> str:
    return os.path.join(state_dir(config), MIG_RECORD_FILE)


def health_record_path(config: AgentConfig) -> str:
    return os.path.join(state_dir(config), HEALTH_RECORD_FILE)


def validate(config: AgentConfig, *, source: str) -> None:
    for attr in ("poll_interval_s", "discovery_interval_s", "report_resync_s", "nvml_retry_max_s", "admission_sweep_s"):
        if not getattr(config, attr) > 0:  # NaN too
            raise ConfigError(
                f"{source}: {_key_of(attr)} ({attr}) = {getattr(config, attr)} must be more than 0 seconds, e.g. 30s"
            )
    for attr in ("admission_sweep_grace_s", "health_quiet_period_s"):
        if not getattr(config, attr) >= 0:  # NaN too
            raise ConfigError(f"{source}: {_key_of(attr)} = {getattr(config, attr)} must be 0 seconds or more, e.g. 2m")
    if not config.verifying_keys:
        raise ConfigError(
            f"{source}: verifyingKeys is empty; give the file or directory of the scheduler's public keys, "
            f"e.g. {DEFAULT_VERIFYING_KEYS} (`fgpuctl keys public`)"
        )
    try:
        parse_address(config.hook_listen, field="hookListen")
        if config.scheduler:
            parse_address(config.scheduler, field="scheduler")
    except AddressError as err:
        raise ConfigError(f"{source}: {err}") from err
    _check_scheduler_tls(config, source=source)
    if config.runtime_endpoint:
        try:
            parse_address(config.runtime_endpoint, field="runtimeEndpoint")
        except AddressError:
            raise ConfigError(
                f"{source}: runtimeEndpoint={config.runtime_endpoint!r} is not a CRI endpoint; write the runtime's "
                "socket as kubelet's --container-runtime-endpoint, e.g. unix:///run/containerd/containerd.sock, "
                "or leave it empty"
            ) from None
    # Flags too: both are re-read or written long after start, whatever the directory is by then.
    _absolute(config.overcommit, field=f"{source}: overcommit",
              example="/etc/fgpu/overcommit/overcommit.yaml (the pool's settings file), or empty (no reclaim)")
    _absolute(config.state_dir, field=f"{source}: stateDir", example="/var/run/fgpu-agent, or empty")
    if config.metrics_listen and not hostport.is_listen_hostport(config.metrics_listen):
        raise ConfigError(
            f"{source}: metricsListen={config.metrics_listen!r} must be HOST:PORT with a port up to 65535 "
            "(e.g. 0.0.0.0:9400; an IPv6 host in brackets: [::]:9400) or empty"
        )


def _check_scheduler_tls(config: AgentConfig, *, source: str) -> None:
    """A scheduler beyond loopback listens only with mutual TLS, so dialling it in plaintext can only fail."""
    try:
        tls.check_complete(config.scheduler_tls, field="schedulerTLS", keys=("certFile", "keyFile", "caFile"))
        tls.check_dial(config.scheduler, config.scheduler_tls, field="scheduler (--scheduler)", tls_key="schedulerTLS")
    except tls.TLSError as err:
        raise ConfigError(f"{source}: {err}") from None


def _convert(attr: str, raw: object, *, where: str) -> Any:
    default = getattr(AgentConfig(), attr)
    if attr == "scheduler_tls":
        return _scheduler_tls(raw, where)
    if attr == "isolation":
        return _isolation(str(raw), where)
    if attr == "isolation_paths":
        return _paths(raw, where)
    if attr in _DURATIONS:
        bounds, example = _DURATIONS[attr]
        try:
            return durations.parse(raw, field=where, bounds=bounds, example=example)
        except durations.DurationError as err:
            raise ConfigError(str(err)) from None
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
    if attr in _PATH_EXAMPLES:
        _absolute(raw, field=where, example=_PATH_EXAMPLES[attr])
    return raw


def _absolute(value: str, *, field: str, example: str) -> None:
    try:
        config_paths.absolute(value, field=field, example=example)
    except config_paths.PathError as err:
        raise ConfigError(str(err)) from None


def _isolation(value: str, where: str) -> str:
    try:
        return registry.parse_name(value, field=where)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _paths(raw: object, where: str) -> IsolationPaths:
    """The keys are every registered backend's `PathKey`s."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping, e.g. {{hamiLibrary: /usr/local/vgpu/libvgpu.so}}")
    known = {k.key: k.key for k in registry.path_keys()}
    values: dict[str, str] = {}
    for key, value in raw.items():
        name = _attr_for(key, known, where=where)
        if not isinstance(value, str) or not value.startswith("/"):
            raise ConfigError(f"{where}.{key}={value!r} must be an absolute path")
        values[name] = value
    return IsolationPaths.from_keys(values)


def _scheduler_tls(raw: object, where: str) -> TLSFiles:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping, e.g. {{caFile: /etc/fgpu/tls/ca.crt, certFile: ..., keyFile: ...}}")
    values: dict[str, str] = {}
    for key, value in raw.items():
        attr = _attr_for(key, _TLS_KEYS, where=where)
        if not isinstance(value, str):
            raise ConfigError(f"{where}.{key}={value!r} must be text (a file path, or the name for serverName)")
        values[attr] = value
    return TLSFiles(**values)


def _key_of(attr: str) -> str:
    """The config file's key for a field, for messages."""
    return next((key for key, value in _KEYS.items() if value == attr), attr)


def _attr_for(key: object, table: Mapping[str, str], *, where: str) -> str:
    attr = table.get(str(key))
    if attr is None:
        raise ConfigError(f"{where}: unknown key {key!r}; known keys are {', '.join(sorted(table))}")
    return attr
