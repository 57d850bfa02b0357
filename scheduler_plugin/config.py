"""The scheduler service's settings: one frozen value, from a YAML file and the command line.

The file uses camelCase keys, like the Kubernetes objects it sits beside:

    state: kubernetes            # or "embedded" (agent reports + SQLite, no cluster)
    db: /var/lib/fgpu/scheduler.db
    kubeconfig: ""               # empty: in-cluster config, then ~/.kube/config
    grpcListen: unix:///run/fgpu/scheduler.sock
    extenderListen: 0.0.0.0:9444 # kube-scheduler HTTP extender (and /metrics, /healthz)
    metricsListen: ""            # a separate HOST:PORT for /metrics; empty: only on the extender port
    standalone: false            # bind pods with schedulerName fgpu-scheduler ourselves
    signingKey: /etc/fgpu/signing-key
    policy: binpack              # node-level policy
    gpuPolicy: ""                # GPU-level policy; empty: the same as policy
    assumeTTLSeconds: 60
    translationRules: ""         # YAML rules file; empty: the built-in rules
    leaderElection:
      enabled: true              # only matters with standalone
      namespace: kube-system
      leaseName: fgpu-scheduler
      leaseDurationSeconds: 15
      renewDeadlineSeconds: 10
      retryPeriodSeconds: 2

Command-line flags override the file. Every mistake is reported with the key,
the value and what to write instead.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from apis import names


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key, the value and the fix."""


class StateBackend(enum.Enum):
    KUBERNETES = "kubernetes"
    EMBEDDED = "embedded"


@dataclass(frozen=True)
class LeaderElectionConfig:
    enabled: bool = True
    namespace: str = "kube-system"
    lease_name: str = names.LEADER_LEASE_NAME
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


@dataclass(frozen=True)
class SchedulerConfig:
    state: StateBackend = StateBackend.KUBERNETES
    db: str = "/var/lib/fgpu/scheduler.db"
    kubeconfig: str = ""
    grpc_listen: str = "unix:///run/fgpu/scheduler.sock"
    extender_listen: str = ""
    metrics_listen: str = ""
    standalone: bool = False
    signing_key: str = "/etc/fgpu/signing-key"
    policy: str = "binpack"
    gpu_policy: str = ""
    assume_ttl_s: float = 60.0
    translation_rules: str = ""
    leader_election: LeaderElectionConfig = field(default_factory=LeaderElectionConfig)


#: file key -> dataclass field
_KEYS: dict[str, str] = {
    "state": "state",
    "db": "db",
    "kubeconfig": "kubeconfig",
    "grpcListen": "grpc_listen",
    "extenderListen": "extender_listen",
    "metricsListen": "metrics_listen",
    "standalone": "standalone",
    "signingKey": "signing_key",
    "policy": "policy",
    "gpuPolicy": "gpu_policy",
    "assumeTTLSeconds": "assume_ttl_s",
    "translationRules": "translation_rules",
    "leaderElection": "leader_election",
}

_LEADER_KEYS: dict[str, str] = {
    "enabled": "enabled",
    "namespace": "namespace",
    "leaseName": "lease_name",
    "leaseDurationSeconds": "lease_duration_s",
    "renewDeadlineSeconds": "renew_deadline_s",
    "retryPeriodSeconds": "retry_period_s",
}


def load_file(path: str) -> SchedulerConfig:
    """Reads a YAML config file; an empty file gives the defaults."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(f"--config={path!r}: cannot read it ({exc.strerror}); give an existing YAML file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config={path!r}: not valid YAML ({exc}); fix the syntax") from exc
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"--config={path!r}: expected a mapping of keys at the top, got {type(data).__name__}")
    return from_mapping(data, where=path)


def from_mapping(data: Mapping[str, Any], *, where: str = "config") -> SchedulerConfig:
    values: dict[str, Any] = {}
    for key, raw in data.items():
        attr = _KEYS.get(str(key))
        if attr is None:
            raise ConfigError(f"{where}: unknown key {key!r}; valid keys are {', '.join(sorted(_KEYS))}")
        if attr == "leader_election":
            values[attr] = _leader(raw, where=f"{where}: leaderElection")
        else:
            values[attr] = _coerce(SchedulerConfig, attr, raw, where=f"{where}: {key}")
    config = SchedulerConfig(**values)
    validate(config)
    return config


def with_overrides(config: SchedulerConfig, **overrides: Any) -> SchedulerConfig:
    """The config with the given fields replaced (None means "not given on the command line")."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if "state" in given and not isinstance(given["state"], StateBackend):
        given["state"] = _coerce(SchedulerConfig, "state", given["state"], where="--state")
    updated = dataclasses.replace(config, **given)
    validate(updated)
    return updated


def validate(config: SchedulerConfig) -> None:
    if config.assume_ttl_s <= 0:
        raise ConfigError(f"assumeTTLSeconds={config.assume_ttl_s}: must be > 0, e.g. 60")
    if config.state is StateBackend.EMBEDDED and not config.db:
        raise ConfigError("db='': the embedded state backend needs a SQLite file; give --db /var/lib/fgpu/scheduler.db")
    if config.state is StateBackend.EMBEDDED and config.standalone:
        raise ConfigError(
            "standalone=true with state=embedded: standalone mode watches pods in a cluster; "
            "use --state kubernetes, or drop --standalone"
        )
    le = config.leader_election
    if not 0 < le.retry_period_s < le.renew_deadline_s < le.lease_duration_s:
        raise ConfigError(
            "leaderElection: need 0 < retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds, got "
            f"{le.retry_period_s} / {le.renew_deadline_s} / {le.lease_duration_s}; e.g. 2 / 10 / 15"
        )


def _leader(raw: Any, *, where: str) -> LeaderElectionConfig:
    if raw is None:
        return LeaderElectionConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        attr = _LEADER_KEYS.get(str(key))
        if attr is None:
            raise ConfigError(f"{where}: unknown key {key!r}; valid keys are {', '.join(sorted(_LEADER_KEYS))}")
        values[attr] = _coerce(LeaderElectionConfig, attr, value, where=f"{where}.{key}")
    return LeaderElectionConfig(**values)


def _coerce(cls: type[Any], attr: str, raw: Any, *, where: str) -> Any:
    default = next(f for f in dataclasses.fields(cls) if f.name == attr).default
    if isinstance(default, StateBackend):
        try:
            return StateBackend(str(raw))
        except ValueError:
            choices = ", ".join(s.value for s in StateBackend)
            raise ConfigError(f"{where}={raw!r}: unknown state backend; use one of {choices}") from None
    if isinstance(default, bool):
        if not isinstance(raw, bool):
            raise ConfigError(f"{where}={raw!r}: expected true or false")
        return raw
    if isinstance(default, float):
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ConfigError(f"{where}={raw!r}: expected a number of seconds, e.g. 15")
        return float(raw)
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise ConfigError(f"{where}={raw!r}: expected a string")
    return raw
