"""The scheduler service's settings: one frozen value, from a YAML file and the command line.

The file uses camelCase keys, like the Kubernetes objects it sits beside:

    state: kubernetes            # or "embedded" (agent reports + SQLite, no cluster)
    db: /var/lib/fgpu/scheduler.db
    kubeconfig: ""               # empty: in-cluster config, then ~/.kube/config
    grpcListen: unix:///run/fgpu/scheduler.sock   # or HOST:PORT: beyond loopback only with grpcTLS
    grpcTLS: {certFile: "", keyFile: "", clientCAFile: ""}      # mutual TLS for a TCP grpcListen
    extenderListen: ""           # kube-scheduler HTTP extender, e.g. 127.0.0.1:9444 (no host: loopback)
    extenderTLS: {certFile: "", keyFile: "", clientCAFile: ""}  # HTTPS + client certs beyond loopback
    metricsListen: ""            # /metrics, /healthz, /readyz alone, e.g. 0.0.0.0:9445 (no secrets there)
    standalone: false            # bind pods with schedulerName fgpu-scheduler ourselves
    signingKey: /etc/fgpu/signing-key   # Ed25519 private key (PEM), re-read on change: rotation restarts nothing
    verifyingKeys: ""            # public keys of earlier signing keys (the agents' set), for pods signed before a rotation
    legacySigningKey: ""         # the v1 HMAC key, only during the upgrade window
    policy: fgpu                 # node-level policy (binpack, spread, fgd, bestfit, ...)
    gpuPolicy: ""                # GPU-level policy; empty: the same as policy
    policyParams: {}             # weights of the node-level policy, e.g. {weight_cpu: 0}
    gpuPolicyParams: {}          # weights of the GPU-level policy; empty: see below
    assumeTTLSeconds: 60
    translationRules: ""         # YAML rules file; empty: the built-in rules
    leaderElection:
      enabled: true              # whenever state is kubernetes: standalone and extender mode alike
      namespace: kube-system
      leaseName: fgpu-scheduler
      leaseDurationSeconds: 15
      renewDeadlineSeconds: 10
      retryPeriodSeconds: 2

Command-line flags override the file. Every mistake is reported with the key,
the value and what to write instead.

Listeners: whoever reaches gRPC or the extender can reserve and bind, so
each is a unix socket or loopback unless its TLS settings are given, and then
clients must present a certificate the given CA signed. A TCP listener beyond
loopback without them is refused here, before anything starts. The metrics
listener only reads (health, counts) and may face the network as it is.

`policyParams` and `gpuPolicyParams` are numeric knobs handed to the policy
(`PolicyContext.params`); what each policy takes (names, types, defaults,
ranges) is what it declared when it registered (`policies.policy_spec`). With
`gpuPolicy` empty the node-level policy instance also chooses the GPUs, tuned
by `policyParams`; `gpuPolicyParams` given without `gpuPolicy` makes a second
instance of the same policy for the GPU choice. The names, types and ranges
are checked against the resolved policies' declarations by `check_policies`,
after the command line has had its say (a flag may change the policy).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis import config_paths, config_yaml, durations, hostport, names, tls
from apis.tls import TLSFiles
from scheduler_plugin.core.policies import DEFAULT_POLICY


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
    grpc_tls: TLSFiles = field(default_factory=TLSFiles)
    #: off unless given: an unused port is only attack surface (and e2e runs several schedulers at once)
    extender_listen: str = ""
    extender_tls: TLSFiles = field(default_factory=TLSFiles)
    metrics_listen: str = ""
    standalone: bool = False
    signing_key: str = "/etc/fgpu/signing-key"
    #: Public keys (PEM file or directory) bound pods' signatures are also checked with; empty: only our own.
    verifying_keys: str = ""
    #: The v1 HMAC key of fgpu before v2 signatures, to check bound pods' v1 ones; empty: v1 refused.
    legacy_signing_key: str = ""
    policy: str = DEFAULT_POLICY
    gpu_policy: str = ""
    policy_params: Mapping[str, float] = field(default_factory=dict)
    gpu_policy_params: Mapping[str, float] = field(default_factory=dict)
    assume_ttl_s: float = 60.0
    translation_rules: str = ""
    leader_election: LeaderElectionConfig = field(default_factory=LeaderElectionConfig)


#: file key -> dataclass field
_KEYS: dict[str, str] = {
    "state": "state",
    "db": "db",
    "kubeconfig": "kubeconfig",
    "grpcListen": "grpc_listen",
    "grpcTLS": "grpc_tls",
    "extenderListen": "extender_listen",
    "extenderTLS": "extender_tls",
    "metricsListen": "metrics_listen",
    "standalone": "standalone",
    "signingKey": "signing_key",
    "verifyingKeys": "verifying_keys",
    "legacySigningKey": "legacy_signing_key",
    "policy": "policy",
    "gpuPolicy": "gpu_policy",
    "policyParams": "policy_params",
    "gpuPolicyParams": "gpu_policy_params",
    "assumeTTLSeconds": "assume_ttl_s",
    "translationRules": "translation_rules",
    "leaderElection": "leader_election",
}

#: keys of grpcTLS / extenderTLS -> TLSFiles field (a server's CA is the one its clients' certificates chain to)
_TLS_KEYS: dict[str, str] = {"certFile": "cert_file", "keyFile": "key_file", "clientCAFile": "ca_file"}

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
        data = config_yaml.load_file(path)
    except config_yaml.YAMLFileError as exc:
        raise ConfigError(f"--config {exc}") from None
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
        elif attr in ("grpc_tls", "extender_tls"):
            values[attr] = _tls(raw, where=f"{where}: {key}")
        elif attr in ("policy_params", "gpu_policy_params"):
            values[attr] = _params(raw, where=f"{where}: {key}")
        else:
            values[attr] = _coerce(SchedulerConfig, attr, raw, where=f"{where}: {key}")
        if attr in _PATH_EXAMPLES:
            _absolute(values[attr], field=f"{where}: {key}", example=_PATH_EXAMPLES[attr])
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
    if not 0 < config.assume_ttl_s <= _MAX_SECONDS:  # NaN too
        raise ConfigError(f"assumeTTLSeconds={config.assume_ttl_s}: must be > 0 and at most {_MAX_SECONDS:g}, e.g. 60")
    if config.state is StateBackend.EMBEDDED and not config.db:
        raise ConfigError("db='': the embedded state backend needs a SQLite file; give --db /var/lib/fgpu/scheduler.db")
    if config.state is StateBackend.EMBEDDED and config.standalone:
        raise ConfigError(
            "standalone=true with state=embedded: standalone mode watches pods in a cluster; "
            "use --state kubernetes, or drop --standalone"
        )
    _check_listeners(config)
    le = config.leader_election
    if not 0 < le.retry_period_s < le.renew_deadline_s < le.lease_duration_s <= _MAX_SECONDS:  # NaN, inf too
        raise ConfigError(
            "leaderElection: need 0 < retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds "
            f"<= {_MAX_SECONDS:g}, got "
            f"{le.retry_period_s} / {le.renew_deadline_s} / {le.lease_duration_s}; e.g. 2 / 10 / 15"
        )
    from scheduler_plugin.leader import fencing_problem  # here: leader.py loads the kubernetes client

    problem = fencing_problem(lease_duration_s=le.lease_duration_s, renew_deadline_s=le.renew_deadline_s)
    if problem:
        raise ConfigError(problem)


def check_policies(config: SchedulerConfig) -> None:
    """Refuses unknown policy names, and parameters the chosen policies did not declare or whose
    type or range their declaration refuses.

    Run on the final config (file plus flags). The policies are built once on an
    empty cluster so their own checks (e.g. "all weights are 0") run before
    start, not at the first decision.
    """
    from scheduler_plugin.core.cluster import ClusterState
    from scheduler_plugin.core.policies import PolicyContext, make_policy, policy_names, policy_spec

    known = policy_names()
    for key, name in (("policy (--policy)", config.policy), ("gpuPolicy (--gpu-policy)", config.gpu_policy)):
        if name and name not in known:
            raise ConfigError(f"{key}={name!r}: unknown policy; choose one of {', '.join(known)}")
    gpu_policy = config.gpu_policy or config.policy
    for key, policy, params in (
        ("policyParams", config.policy, config.policy_params),
        ("gpuPolicyParams", gpu_policy, config.gpu_policy_params),
    ):
        if not params:
            continue
        accepted = policy_spec(policy).param_names
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            takes = f"it takes {', '.join(accepted)}" if accepted else "it takes none; remove the key"
            raise ConfigError(
                f"{key}: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a parameter of "
                f"policy {policy!r}; {takes}"
            )
        try:
            make_policy(policy, context=PolicyContext(state=ClusterState(), params=dict(params)))
        except ValueError as exc:
            raise ConfigError(f"{key}={dict(params)!r}: {exc}") from None


#: A day: longer than any TTL or lease anyone means; a bigger number (or inf) is a typo, and timers reject it.
_MAX_SECONDS = durations.DAY
#: The TTL and the lease times: more than 0 (the lease's order is `validate`'s), at most a day.
_SECONDS = durations.Bounds(maximum=_MAX_SECONDS)
#: Files the config names, with an example of each. A relative one would be read from the daemon's
#: working directory, not the config file's (flags are not checked: the shell's directory is meant).
_PATH_EXAMPLES: dict[str, str] = {
    "db": "/var/lib/fgpu/scheduler.db",
    "kubeconfig": "/etc/fgpu/kubeconfig",
    "signing_key": "/etc/fgpu/signing-key",
    "verifying_keys": "/etc/fgpu/verifying-keys",
    "legacy_signing_key": "/etc/fgpu/legacy-signing-key/signing-key",
    "translation_rules": "/etc/fgpu/rules/rules.yaml",
}


def _absolute(value: str, *, field: str, example: str) -> None:
    try:
        config_paths.absolute(value, field=field, example=example)
    except config_paths.PathError as exc:
        raise ConfigError(str(exc)) from None


def _params(raw: Any, *, where: str) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}={raw!r}: expected a mapping of parameter name to number, e.g. {{weight_cpu: 0}}")
    values: dict[str, float] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{where}: parameter name {name!r} must be a non-empty string, e.g. weight_cpu")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{where}.{name}={value!r}: expected a finite number, e.g. {name}: 1")
        values[name] = float(value)
    return values


def _check_listeners(config: SchedulerConfig) -> None:
    tls_keys = ("certFile", "keyFile", "clientCAFile")
    try:
        tls.check_complete(config.grpc_tls, field="grpcTLS", keys=tls_keys)
        tls.check_complete(config.extender_tls, field="extenderTLS", keys=tls_keys)
        tls.check_listener(config.grpc_listen, config.grpc_tls, field="grpcListen (--grpc-listen)", tls_key="grpcTLS")
        if config.extender_listen:
            field_ = "extenderListen (--extender-listen)"
            host, port = tls.split_hostport(config.extender_listen, field=field_, example="127.0.0.1:9444")
            # No host means loopback for the HTTP listeners (gRPC's own parser reads it as every interface).
            tls.check_listener(f"{host or '127.0.0.1'}:{port}", config.extender_tls, field=field_, tls_key="extenderTLS")
        if config.metrics_listen:
            tls.split_hostport(config.metrics_listen, field="metricsListen (--metrics-listen)", example="0.0.0.0:9445")
    except tls.TLSError as exc:
        raise ConfigError(str(exc)) from None
    for key, address in (("extenderListen (--extender-listen)", config.extender_listen),
                         ("metricsListen (--metrics-listen)", config.metrics_listen)):
        if address and not hostport.is_listen_hostport(address):
            raise ConfigError(
                f"{key}={address!r}: expected HOST:PORT with a port up to 65535, e.g. 127.0.0.1:9444 "
                "(an IPv6 host in brackets: [::1]:9444)"
            )


def _tls(raw: Any, *, where: str) -> TLSFiles:
    if raw is None:
        return TLSFiles()
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{where}={raw!r}: expected a mapping, e.g. {{certFile: /etc/fgpu/tls/tls.crt, "
            "keyFile: /etc/fgpu/tls/tls.key, clientCAFile: /etc/fgpu/tls/ca.crt}"
        )
    values: dict[str, str] = {}
    for key, value in raw.items():
        attr = _TLS_KEYS.get(str(key))
        if attr is None:
            raise ConfigError(f"{where}: unknown key {key!r}; valid keys are {', '.join(_TLS_KEYS)}")
        if not isinstance(value, str):
            raise ConfigError(f"{where}.{key}={value!r}: expected a file path")
        values[attr] = value
    return TLSFiles(**values)


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
        # Every float here is a time in seconds (a `...Seconds` key); Go's form (15s, 1m) is read too.
        try:
            return durations.parse(raw, field=where, bounds=_SECONDS, example=f"{default:g}")
        except durations.DurationError as exc:
            raise ConfigError(str(exc)) from None
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise ConfigError(f"{where}={raw!r}: expected a string")
    return raw
