"""fgpu-webhook's config file (`--config`): the translation rules, and where the scheduler name is set.

camelCase keys, like the Kubernetes objects beside it; every key is optional::

    translationRules: /etc/fgpu/rules/rules.yaml  # the scheduler's rules file; empty: the built-in rules
    schedulerInjection:
      enabled: true               # false: only the allocation annotations are removed
      namespaces: []              # only these namespaces; empty: every namespace
      excludeNamespaces: []       # never these
      podSelector:                # a label selector on the pod's labels; empty: every pod
        matchLabels: {team: ml}
        matchExpressions:
          - {key: gpu-tier, operator: In, values: [shared, batch]}

Pods opt out with the label `fgpu.io/inject-scheduler: "false"`. The rules
file is re-read when it changes, as the scheduler re-reads it; give both the
same ConfigMap so that they read pods alike. Every mistake is reported with
the key, the value and what to write instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis import config_paths, config_yaml, labels
from webhook.errors import ConfigError
from webhook.scope import LabelSelector, Operator, Requirement, Scope


@dataclass(frozen=True)
class WebhookConfig:
    translation_rules: str = ""
    scope: Scope = field(default_factory=Scope)


def load(path: str) -> WebhookConfig:
    try:
        data = config_yaml.load_file(path)
    except config_yaml.YAMLFileError as exc:
        raise ConfigError(f"--config {exc}") from None
    return from_mapping({} if data is None else data, origin=path)


def from_mapping(data: object, *, origin: str = "<config>") -> WebhookConfig:
    top = _map(data, origin, "the file")
    _only(top, {"translationRules", "schedulerInjection"}, origin, "")
    rules = top.get("translationRules")
    rules = "" if rules is None else rules  # `translationRules:` with no value: the built-in rules
    if not isinstance(rules, str):
        raise ConfigError(f"{origin}: translationRules: {rules!r} must be a file path, or empty for the built-in rules")
    try:
        config_paths.absolute(rules, field=f"{origin}: translationRules", example="/etc/fgpu/rules/rules.yaml")
    except config_paths.PathError as exc:
        raise ConfigError(str(exc)) from None
    return WebhookConfig(translation_rules=rules, scope=_scope(top.get("schedulerInjection"), origin))


def _scope(raw: object, origin: str) -> Scope:
    where = "schedulerInjection"
    data = _map({} if raw is None else raw, origin, where)
    _only(data, {"enabled", "namespaces", "excludeNamespaces", "podSelector"}, origin, where)
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{origin}: {where}.enabled: {enabled!r} must be true or false")
    return Scope(
        enabled=enabled,
        namespaces=_names(data.get("namespaces"), origin, f"{where}.namespaces", namespaces=True),
        exclude_namespaces=_names(data.get("excludeNamespaces"), origin, f"{where}.excludeNamespaces", namespaces=True),
        pod_selector=_selector(data.get("podSelector"), origin, f"{where}.podSelector"),
    )


def _selector(raw: object, origin: str, where: str) -> LabelSelector:
    data = _map({} if raw is None else raw, origin, where)
    _only(data, {"matchLabels", "matchExpressions"}, origin, where)
    requirements: list[Requirement] = []
    match_labels = _map(data.get("matchLabels") or {}, origin, f"{where}.matchLabels")
    for key, value in match_labels.items():
        _check_key(str(key), origin, f"{where}.matchLabels: key {str(key)!r}")
        if not isinstance(value, str | int | bool) or isinstance(value, bool):
            raise ConfigError(f"{origin}: {where}.matchLabels.{key}: {value!r} must be a label value (quote it: \"true\")")
        _check_value(str(value), origin, f"{where}.matchLabels.{key}: {str(value)!r}")
        requirements.append(Requirement(key=str(key), operator=Operator.IN, values=frozenset({str(value)})))
    expressions = data.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise ConfigError(f"{origin}: {where}.matchExpressions: expected a list of {{key, operator, values}}")
    for index, item in enumerate(expressions):
        at = f"{where}.matchExpressions[{index}]"
        expression = _map(item, origin, at)
        _only(expression, {"key", "operator", "values"}, origin, at)
        label = expression.get("key")
        if not isinstance(label, str) or not label:
            raise ConfigError(f"{origin}: {at}.key: {label!r} must be a label key")
        _check_key(label, origin, f"{at}.key: {label!r}")
        try:
            operator = Operator(expression.get("operator"))
        except ValueError:
            known = ", ".join(o.value for o in Operator)
            raise ConfigError(f"{origin}: {at}.operator: {expression.get('operator')!r} is not one of {known}") from None
        values = _names(expression.get("values"), origin, f"{at}.values")
        for value in sorted(values):
            _check_value(value, origin, f"{at}.values: {value!r}")
        if operator in (Operator.IN, Operator.NOT_IN) and not values:
            raise ConfigError(f"{origin}: {at}: {operator.value} needs values: [...]")
        if operator in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and values:
            raise ConfigError(f"{origin}: {at}: {operator.value} takes no values; remove them")
        requirements.append(Requirement(key=label, operator=operator, values=values))
    return LabelSelector(requirements=tuple(requirements))


def _names(raw: object, origin: str, where: str, *, namespaces: bool = False) -> frozenset[str]:
    if raw is None:
        return frozenset()
    if not isinstance(raw, list) or not all(isinstance(v, str) and v for v in raw):
        raise ConfigError(f"{origin}: {where}: {raw!r} must be a list of names, e.g. [ml, serving]")
    if namespaces:
        for name in raw:
            # A name no namespace can have matches nothing, silently; say so instead.
            if len(name) > 63 or not _NAMESPACE.match(name):
                raise ConfigError(
                    f"{origin}: {where}: {name!r} is not a namespace name (lowercase letters, digits and '-', "
                    "at most 63); write it as `kubectl get namespaces` shows it"
                )
    return frozenset(raw)


_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# A selector naming a label no pod can carry matches nothing, silently (the API server refuses such
# labels); say so at start instead.
def _check_key(key: str, origin: str, where: str) -> None:
    problem = labels.problem_with_key(key)
    if problem:
        raise ConfigError(
            f"{origin}: {where}: {problem}; write the key as the pod carries it, e.g. team or example.com/team"
        )


def _check_value(value: str, origin: str, where: str) -> None:
    problem = labels.problem_with_value(value)
    if problem:
        raise ConfigError(f"{origin}: {where}: {problem}; write the value as the pod carries it, e.g. ml-training")


def _map(raw: object, origin: str, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{origin}: {where}: expected a mapping, got {type(raw).__name__}")
    return raw


def _only(data: Mapping[str, Any], allowed: set[str], origin: str, where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"{origin}: {prefix}{unknown[0]}: unknown key; the keys here are {', '.join(sorted(allowed))}"
        )
