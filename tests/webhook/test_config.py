"""The config file: every key read, every mistake named with the key, the value and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook import config
from webhook.config import WebhookConfig
from webhook.errors import ConfigError
from webhook.scope import LabelSelector, Operator, Requirement, Scope

FULL = """
translationRules: /etc/fgpu/rules/rules.yaml
schedulerInjection:
  enabled: true
  namespaces: [ml, serving]
  excludeNamespaces: [ml-legacy]
  podSelector:
    matchLabels: {team: ml}
    matchExpressions:
      - {key: gpu-tier, operator: In, values: [shared, batch]}
      - {key: legacy, operator: DoesNotExist}
"""


def test_every_key_is_read(tmp_path: Path) -> None:
    path = tmp_path / "webhook.yaml"
    path.write_text(FULL)
    assert config.load(str(path)) == WebhookConfig(
        translation_rules="/etc/fgpu/rules/rules.yaml",
        scope=Scope(
            namespaces=frozenset({"ml", "serving"}),
            exclude_namespaces=frozenset({"ml-legacy"}),
            pod_selector=LabelSelector((
                Requirement("team", Operator.IN, frozenset({"ml"})),
                Requirement("gpu-tier", Operator.IN, frozenset({"shared", "batch"})),
                Requirement("legacy", Operator.DOES_NOT_EXIST),
            )),
        ),
    )


def test_an_empty_file_is_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert config.load(str(path)) == WebhookConfig()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"translationrules": "x"}, "translationrules: unknown key; the keys here are schedulerInjection, translationRules"),
        ({"translationRules": 3}, "translationRules: 3 must be a file path"),
        ({"schedulerInjection": []}, "schedulerInjection: expected a mapping, got list"),
        ({"schedulerInjection": {"enabled": "yes"}}, "schedulerInjection.enabled: 'yes' must be true or false"),
        ({"schedulerInjection": {"namespaces": "ml"}}, "schedulerInjection.namespaces: 'ml' must be a list of names"),
        ({"schedulerInjection": {"podSelector": {"matchLabels": {"a": ["b"]}}}}, "must be a label value"),
        ({"schedulerInjection": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Has"}]}}},
         "operator: 'Has' is not one of In, NotIn, Exists, DoesNotExist"),
        ({"schedulerInjection": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}},
         "In needs values"),
        ({"schedulerInjection": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists",
                                                                       "values": ["x"]}]}}}, "takes no values"),
        ({"schedulerInjection": {"podSelector": {"matchExpressions": [{"operator": "Exists"}]}}}, ".key: None must be"),
        ({"schedulerInjection": {"podSelector": {"matchFields": []}}}, "podSelector.matchFields: unknown key"),
        ([1], "the file: expected a mapping, got list"),
    ],
)
def test_a_mistake_is_named(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config.from_mapping(data, origin="webhook.yaml")
    assert message in str(raised.value)
    assert str(raised.value).startswith("webhook.yaml: ")


def test_an_unreadable_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--config .*cannot read"):
        config.load(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(str(bad))
