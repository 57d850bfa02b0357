"""Review of the forms every config accepts: one duration form everywhere, absolute file paths, label syntax.

Durations were parsed per component, each with its own subset of Go's form (the proxy took only
`500ms` or `2s`, the scheduler only numbers); a relative file path in a daemon's config depended on
the daemon's working directory (`/` under systemd); a webhook `matchLabels` key no label can have
matched nothing, silently. Each case here is refused (or read) with the field, the value and the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import config as agent_config
from agent.errors import ConfigError as AgentConfigError
from agent.reclaim_settings import parse as parse_overcommit
from runtimeproxy import config as proxy_config
from runtimeproxy import hookconfig
from runtimeproxy.errors import ConfigError as ProxyConfigError
from scheduler_plugin import config as scheduler_config
from webhook import config as webhook_config
from webhook.errors import ConfigError as WebhookConfigError


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- one duration form in every config ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "attr", "seconds"),
    [
        ("pollInterval: .5s\n", "poll_interval_s", 0.5),
        ("pollInterval: 250000us\n", "poll_interval_s", 0.25),
        ("reportResync: 1m30s\n", "report_resync_s", 90.0),
        ("healthQuietPeriod: 0\n", "health_quiet_period_s", 0.0),
    ],
)
def test_the_agent_reads_every_go_duration(tmp_path: Path, text: str, attr: str, seconds: float) -> None:
    config = agent_config.load_config_file(write(tmp_path, "agent.yaml", text))
    assert getattr(config, attr) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "attr", "seconds"),
    [
        ("lookupTimeout: 1m30s\n", "lookup_timeout_s", 90.0),
        ("backendDialTimeout: 1.5s\n", "backend_dial_timeout_s", 1.5),
        ("hookRefreshInterval: 750ms\n", "hook_refresh_s", 0.75),
    ],
)
def test_the_proxy_reads_every_go_duration(tmp_path: Path, text: str, attr: str, seconds: float) -> None:
    assert getattr(proxy_config.load_file(write(tmp_path, "proxy.yaml", text)), attr) == seconds


def test_a_hook_timeout_reads_minutes_too(tmp_path: Path) -> None:
    hooks = hookconfig.parse_file(write(
        tmp_path, "10-hook.yaml", "name: h\nendpoint: unix:///run/h.sock\nstages: [PreCreateContainer]\ntimeout: 1m\n",
    ))
    assert hooks[0].timeout_s == 60.0


def test_the_scheduler_reads_a_go_duration_beside_its_numbers(tmp_path: Path) -> None:
    config = scheduler_config.load_file(write(
        tmp_path, "scheduler.yaml", "assumeTTLSeconds: 2m\nleaderElection: {leaseDurationSeconds: 20s}\n",
    ))
    assert (config.assume_ttl_s, config.leader_election.lease_duration_s) == (120.0, 20.0)


def test_the_overcommit_settings_read_microseconds_and_compounds() -> None:
    settings = parse_overcommit({"interval": "500000us", "cooldown": "1h30m"}, source="overcommit.yaml")
    assert (settings.interval_s, settings.policy.cooldown_s) == (0.5, 5400.0)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("pollInterval: '-5s'\n", "pollInterval='-5s': must not be negative"),
        ("pollInterval: true\n", "pollInterval=True: not a duration"),
        ("pollInterval: ''\n", "pollInterval='': not a duration"),
        ("discoveryInterval: 0s\n", "discoveryInterval='0s': must be more than zero"),
        ("admissionSweepGrace: 400d\n", "admissionSweepGrace='400d': not a duration"),
        ("healthQuietPeriod: 9000h\n", "healthQuietPeriod='9000h': at most"),
    ],
)
def test_the_agent_refuses_a_bad_duration_naming_the_key_value_and_an_example(
    tmp_path: Path, text: str, fragment: str
) -> None:
    with pytest.raises(AgentConfigError, match="e\\.g\\.") as caught:
        agent_config.load_config_file(write(tmp_path, "agent.yaml", text))
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("lookupTimeout: '-1s'\n", "lookupTimeout='-1s': must not be negative"),
        ("lookupTimeout: 2d\n", "lookupTimeout='2d': not a duration"),
        ("backendDialTimeout: 25h\n", "backendDialTimeout='25h': at most 86400s"),
    ],
)
def test_the_proxy_refuses_a_bad_duration_naming_the_key_value_and_an_example(
    tmp_path: Path, text: str, fragment: str
) -> None:
    with pytest.raises(ProxyConfigError, match="e\\.g\\.") as caught:
        proxy_config.load_file(write(tmp_path, "proxy.yaml", text))
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("assumeTTLSeconds: soon\n", "assumeTTLSeconds='soon': not a duration"),
        ("assumeTTLSeconds: -3\n", "assumeTTLSeconds=-3: must not be negative"),
        ("leaderElection: {retryPeriodSeconds: .nan}\n", "retryPeriodSeconds=nan: not a finite number"),
    ],
)
def test_the_scheduler_refuses_a_bad_duration_naming_the_key_value_and_an_example(
    tmp_path: Path, text: str, fragment: str
) -> None:
    with pytest.raises(scheduler_config.ConfigError, match="e\\.g\\.") as caught:
        scheduler_config.load_file(write(tmp_path, "scheduler.yaml", text))
    assert fragment in str(caught.value)


def test_a_huge_integer_duration_is_refused_with_a_short_message() -> None:
    with pytest.raises(AgentConfigError, match="pollInterval") as caught:
        agent_config.parse_config({"pollInterval": 10**400})
    assert len(str(caught.value)) < 300


# --- file paths in a daemon's config are absolute -------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("fakeNvml", "inventories/h100.yaml"),
        ("checkpointPath", "kubelet/device-plugins/kubelet_internal_checkpoint"),
        ("verifyingKeys", "verifying-keys"),
        ("legacySigningKey", "./legacy.key"),
    ],
)
def test_the_agent_config_refuses_a_relative_file_path(key: str, value: str) -> None:
    with pytest.raises(AgentConfigError) as caught:
        agent_config.parse_config({key: value}, source="agent.yaml")
    message = str(caught.value)
    assert f"{key}={value!r}" in message and "absolute path" in message and "e.g. /" in message


def test_the_agent_flags_may_still_name_a_file_relative_to_the_shell() -> None:
    # A flag is resolved against the directory of whoever typed it, which is what they meant.
    config = agent_config.with_overrides(agent_config.AgentConfig(), fake_nvml="examples/inventories/t4-4x-pcie.yaml")
    assert config.fake_nvml == "examples/inventories/t4-4x-pcie.yaml"


def test_the_scheduler_config_refuses_a_relative_db(tmp_path: Path) -> None:
    with pytest.raises(scheduler_config.ConfigError) as caught:
        scheduler_config.load_file(write(tmp_path, "scheduler.yaml", "state: embedded\ndb: scheduler.db\n"))
    message = str(caught.value)
    assert "db='scheduler.db'" in message and "absolute path" in message and "/var/lib/fgpu/scheduler.db" in message


@pytest.mark.parametrize("key", ["signingKey", "verifyingKeys", "translationRules"])
def test_the_scheduler_config_refuses_other_relative_files(key: str) -> None:
    with pytest.raises(scheduler_config.ConfigError, match=f"{key}='keys/x.pem' must be an absolute path"):
        scheduler_config.from_mapping({key: "keys/x.pem"}, where="scheduler.yaml")


def test_the_webhook_config_refuses_relative_translation_rules() -> None:
    with pytest.raises(WebhookConfigError, match=r"translationRules='rules\.yaml' must be an absolute path.*e\.g\. /"):
        webhook_config.from_mapping({"translationRules": "rules.yaml"}, origin="webhook.yaml")


def test_the_scheduler_config_still_reads_an_absolute_db(tmp_path: Path) -> None:
    config = scheduler_config.load_file(write(tmp_path, "scheduler.yaml", "state: embedded\ndb: /var/lib/x.db\n"))
    assert config.db == "/var/lib/x.db"


# --- webhook label selectors use Kubernetes' label syntax -----------------------------------------


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ({"matchLabels": {"Team Name": "ml"}}, "matchLabels: key 'Team Name'"),
        ({"matchLabels": {"-team": "ml"}}, "matchLabels: key '-team'"),
        ({"matchLabels": {"a/b/c": "ml"}}, "matchLabels: key 'a/b/c'"),
        ({"matchLabels": {"Example.com/team": "ml"}}, "matchLabels: key 'Example.com/team'"),
        ({"matchLabels": {"example.com/": "ml"}}, "matchLabels: key 'example.com/'"),
        ({"matchLabels": {"t" * 64: "ml"}}, "matchLabels: key 'tttt"),
        ({"matchLabels": {"team": "machine learning"}}, "matchLabels.team: 'machine learning'"),
        ({"matchLabels": {"team": "ml-"}}, "matchLabels.team: 'ml-'"),
        ({"matchLabels": {"team": "m" * 64}}, "matchLabels.team: 'mmmm"),
        ({"matchExpressions": [{"key": "gpu tier", "operator": "Exists"}]}, "matchExpressions[0].key: 'gpu tier'"),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a b"]}]}, "matchExpressions[0].values"),
    ],
)
def test_the_webhook_refuses_a_label_selector_no_label_can_match(selector: object, fragment: str) -> None:
    with pytest.raises(WebhookConfigError) as caught:
        webhook_config.from_mapping({"schedulerInjection": {"podSelector": selector}}, origin="webhook.yaml")
    message = str(caught.value)
    assert fragment in message and "e.g." in message


def test_the_webhook_reads_prefixed_keys_and_empty_values() -> None:
    config = webhook_config.from_mapping({"schedulerInjection": {"podSelector": {"matchLabels": {
        "example.com/team": "ml", "app.kubernetes.io/name": "trainer", "tier": "", "T_1.x": 7,
    }}}})
    keys = {r.key for r in config.scope.pod_selector.requirements}
    assert keys == {"example.com/team", "app.kubernetes.io/name", "tier", "T_1.x"}
