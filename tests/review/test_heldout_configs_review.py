"""Held-out review of every daemon's hand-written configuration input.

The developers' guide promises: "Bad input gets a clear error that names the field, the value and
the fix. It loses nothing and never crashes a daemon." These tests feed each documented config
(agent, runtime proxy and its hooks.d registrations, scheduler, webhook, translation rules,
overcommit settings) inputs the components' own tests do not use: NaN and infinite durations,
keys written twice, bytes that are not UTF-8, YAML nested thousands deep, alias bombs, wrong
types. Loaders are called in-process; the entry points run as subprocesses only where the
process boundary is the point (exit code, no traceback, bounded memory).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent import config as agent_config
from agent.errors import ConfigError as AgentConfigError
from agent.reclaim_settings import SettingsFile
from apis.rules_file import RulesError, TranslationRules
from apis.rules_watcher import RulesWatcher
from runtimeproxy import config as proxy_config
from runtimeproxy import hookconfig
from runtimeproxy.errors import ConfigError as ProxyConfigError
from scheduler_plugin import config as scheduler_config
from webhook import config as webhook_config
from webhook.errors import ConfigError as WebhookConfigError

ROOT = Path(__file__).resolve().parents[2]
NOT_UTF8 = b"nodeName: caf\xe9\n"
DEEP = "[" * 3000 + "]" * 3000
GOOD_RULES = "version: 1\nrules:\n- name: vendor-a\n  count: {resource: vendor-a.example/gpu}\n"


def write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def bomb(key: str) -> str:
    """`key:` holding ten nested levels of ten aliases each: 10**10 values once expanded."""
    levels = ["&l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 10)]
    return f"{key}: [{', '.join(levels)}]\n"


def bump_mtime(path: str, step: int) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + step * 1_000_000_000))


# --- the agent ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("pollInterval: .nan\n", "pollInterval"),
        ("discoveryInterval: .inf\n", "discoveryInterval"),
        ("admissionSweepGrace: .nan\n", "admissionSweepGrace"),
        ("healthQuietPeriod: -5\n", "healthQuietPeriod"),
        ("reportResync: 99999999999999999999h\n", "reportResync"),
    ],
)
def test_agent_refuses_durations_that_are_not_a_finite_positive_time(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, "agent.yaml", text)
    with pytest.raises(AgentConfigError, match=key):
        agent_config.load_config_file(path)


def test_agent_reads_go_style_compound_durations(tmp_path: Path) -> None:
    path = write(tmp_path, "agent.yaml", "healthQuietPeriod: 1h30m\nadmissionSweepGrace: 2m30s\n")
    config = agent_config.load_config_file(path)
    assert config.health_quiet_period_s == 5400.0
    assert config.admission_sweep_grace_s == 150.0


def test_agent_refuses_a_key_written_twice(tmp_path: Path) -> None:
    path = write(tmp_path, "agent.yaml", "nodeName: gpu-a\npollInterval: 1s\nnodeName: gpu-b\n")
    with pytest.raises(AgentConfigError, match=r"nodeName.*twice"):
        agent_config.load_config_file(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("metricsListen: 0.0.0.0:99999\n", "metricsListen"),
        ("metricsListen: '::1'\n", "metricsListen"),
    ],
)
def test_agent_refuses_a_metrics_address_it_cannot_listen_on(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(AgentConfigError, match=fragment):
        agent_config.load_config_file(write(tmp_path, "agent.yaml", text))


def test_agent_config_nested_thousands_deep_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(AgentConfigError, match="nested too deeply"):
        agent_config.load_config_file(write(tmp_path, "agent.yaml", f"nodeName: {DEEP}\n"))


def test_agent_entry_point_names_a_config_that_is_not_utf8_without_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "agent.yaml", NOT_UTF8)
    inventory = ROOT / "examples" / "inventories" / "t4-4x-pcie.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "agent.main", "--config", path, "--once", "--print", "device",
         "--fake-nvml", str(inventory)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert path in result.stderr and "UTF-8" in result.stderr


# --- every loader against an alias bomb, in one bounded subprocess -------------------------------

_BOMB_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    from agent import config as a
    from agent.reclaim_settings import SettingsFile
    from apis.rules_file import TranslationRules
    from runtimeproxy import config as p, hookconfig as h
    from scheduler_plugin import config as s
    from webhook import config as w
    d = sys.argv[1]
    def refused(fn, path):
        try:
            fn(path)
        except ValueError as exc:
            return "anchors" in str(exc)
        except Exception:
            return False
        return False
    ok = {
        "agent": refused(a.load_config_file, d + "/agent.yaml"),
        "proxy": refused(p.load_file, d + "/proxy.yaml"),
        "hook": refused(h.parse_file, d + "/hook.yaml"),
        "scheduler": refused(s.load_file, d + "/scheduler.yaml"),
        "webhook": refused(w.load, d + "/webhook.yaml"),
        "rules": refused(TranslationRules.load, d + "/rules.yaml"),
    }
    settings = SettingsFile(d + "/overcommit.yaml")
    settings.reload()
    ok["overcommit"] = "anchors" in settings.error
    print(ok)
    sys.exit(0 if all(ok.values()) else 1)
    """
)


def test_every_config_loader_refuses_a_billion_laughs_bomb_fast_and_in_bounded_memory(tmp_path: Path) -> None:
    for name, key in [
        ("agent", "kubeconfig"), ("proxy", "hookServerNamespaces"), ("hook", "name"),
        ("scheduler", "policyParams"), ("webhook", "translationRules"), ("rules", "rules"), ("overcommit", "ratio"),
    ]:
        write(tmp_path, f"{name}.yaml", bomb(key))
    result = subprocess.run(
        [sys.executable, "-c", _BOMB_SCRIPT, str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]


# --- the runtime proxy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("hookRefreshInterval: .nan\n", "hookRefreshInterval"),
        ("lookupTimeout: .inf\n", "lookupTimeout"),
        ("socketMode: [660]\n", "socketMode"),
        ("socketMode: true\n", "socketMode"),
        ("socketMode: 0.5\n", "socketMode"),
        ("metricsListen: 127.0.0.1:99999\n", "metricsListen"),
        ("metricsListen: '::1'\n", "metricsListen"),
        ("listen: unix:///var/run/a.sock\nlisten: unix:///var/run/b.sock\n", "listen"),
        ("hookConfigDir: hooks.d\n", "hookConfigDir"),
    ],
)
def test_proxy_refuses_bad_settings_with_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ProxyConfigError, match=key):
        proxy_config.load_file(write(tmp_path, "proxy.yaml", text))


@pytest.mark.parametrize("text", [NOT_UTF8, f"listen: {DEEP}\n"])
def test_proxy_config_that_cannot_be_read_is_a_config_error(tmp_path: Path, text: str | bytes) -> None:
    with pytest.raises(ProxyConfigError, match=r"proxy\.yaml"):
        proxy_config.load_file(write(tmp_path, "proxy.yaml", text))


_HOOK = "name: {name}\nendpoint: unix:///var/run/{name}.sock\nstages: [PreCreateContainer]\n"


@pytest.mark.parametrize(
    "bad",
    [
        NOT_UTF8,
        f"name: {DEEP}\n",
        _HOOK.format(name="late") + "name: later\n",
        _HOOK.format(name="late") + "timeout: .nan\n",
        _HOOK.format(name="late") + "timeout: .inf\n",
    ],
    ids=["not-utf8", "deep", "duplicate-key", "nan-timeout", "inf-timeout"],
)
def test_a_bad_hook_file_added_later_keeps_the_good_ones_and_is_named(tmp_path: Path, bad: str | bytes) -> None:
    write(tmp_path, "10-good.yaml", _HOOK.format(name="good"))
    registry = hookconfig.HookRegistry(str(tmp_path))
    assert [s.name for s in registry.servers()] == ["good"]
    write(tmp_path, "20-bad.yaml", bad)
    registry.refresh()  # must not raise: the proxy's refresh loop would only log it, and the bad file would never be named
    assert [s.name for s in registry.servers()] == ["good"]
    assert "20-bad.yaml" in registry.errors.get("20-bad.yaml", "")


# --- the scheduler ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("assumeTTLSeconds: .nan\n", "assumeTTLSeconds"),
        ("assumeTTLSeconds: .inf\n", "assumeTTLSeconds"),
        ("leaderElection: {leaseDurationSeconds: .inf}\n", "leaseDurationSeconds"),
        ("extenderListen: 127.0.0.1:99999\n", "extenderListen"),
        ("metricsListen: '::1'\n", "metricsListen"),
        ("db: /var/lib/a.db\ndb: /var/lib/b.db\n", "db"),
    ],
)
def test_scheduler_refuses_bad_settings_with_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(scheduler_config.ConfigError, match=key):
        scheduler_config.load_file(write(tmp_path, "scheduler.yaml", text))


def test_scheduler_config_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(scheduler_config.ConfigError, match="UTF-8"):
        scheduler_config.load_file(write(tmp_path, "scheduler.yaml", NOT_UTF8))


# --- the webhook --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("translationRules: false\n", "translationRules"),
        ("translationRules: 0\n", "translationRules"),
        ("schedulerInjection: {namespaces: [Not A Namespace]}\n", "namespaces"),
        ("translationRules: /etc/a.yaml\ntranslationRules: /etc/b.yaml\n", "translationRules"),
    ],
)
def test_webhook_refuses_bad_settings_with_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(WebhookConfigError, match=key):
        webhook_config.load(write(tmp_path, "webhook.yaml", text))


def test_webhook_config_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(WebhookConfigError, match="UTF-8"):
        webhook_config.load(write(tmp_path, "webhook.yaml", NOT_UTF8))


# --- translation rules --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("version: true\nrules:\n- name: a\n  count: {resource: x.example/gpu}\n", "version"),
        ("version: 1.0\nrules:\n- name: a\n  count: {resource: x.example/gpu}\n", "version"),
        ("version: 1\nrules:\n- name: a\n  memory: {resource: x.example/mem, unit: [Mi]}\n", "unit"),
        ("version: 1\nrules:\n- name: a\n  name: b\n  count: {resource: x.example/gpu}\n", "name"),
    ],
)
def test_rules_refuse_bad_values_with_the_field(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(RulesError, match=fragment):
        TranslationRules.load(write(tmp_path, "rules.yaml", text))


@pytest.mark.parametrize("bad", [NOT_UTF8, f"rules: {DEEP}\n"], ids=["not-utf8", "deep"])
def test_a_bad_rules_edit_keeps_the_last_good_rules_and_says_why(tmp_path: Path, bad: str | bytes) -> None:
    path = write(tmp_path, "rules.yaml", GOOD_RULES)
    now = [0.0]
    watcher = RulesWatcher(path, min_interval_s=1.0, clock=lambda: now[0])
    write(tmp_path, "rules.yaml", bad)
    bump_mtime(path, 5)
    now[0] = 10.0
    rules = watcher.current()  # must not raise: the scheduler and webhook ask on every pod
    assert [r.name for r in rules.rules] == ["vendor-a"]
    assert watcher.last_error is not None and "rules.yaml" in watcher.last_error


# --- overcommit settings ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (NOT_UTF8, "UTF-8"),
        (f"ratio: {DEEP}\n", "nested too deeply"),
        ("interval: .nan\n", "interval"),
        ("interval: .inf\n", "interval"),
        ("pressureGrace: .nan\n", "pressureGrace"),
        ("cooldown: .inf\n", "cooldown"),
        ("ratio: 1.5\nratio: 2\n", "ratio"),
    ],
)
def test_a_bad_overcommit_edit_keeps_the_settings_in_force(tmp_path: Path, bad: str | bytes, fragment: str) -> None:
    path = write(tmp_path, "overcommit.yaml", "ratio: 1.5\ninterval: 2s\n")
    settings = SettingsFile(path)
    assert settings.reload() and settings.current.ratio == 1.5
    write(tmp_path, "overcommit.yaml", bad)
    bump_mtime(path, 5)
    assert settings.reload() is False  # "Never raises"
    assert settings.current.ratio == 1.5 and settings.current.interval_s == 2.0
    assert fragment in settings.error and "keeping the settings in force" in settings.error
