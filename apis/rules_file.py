"""The translation rules file: its YAML schema, the loader, and the ordered rule set it yields.

The built-in rules are in `apis/rules/default.yaml`; the format is documented
in docs/translation-rules.md. Every error names the file, the rule and the
field, and says how to fix it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from apis import config_yaml, names
from apis.translation_rule import KOORDINATOR_SOURCE, MEMORY_UNITS, CountSpec, Per, Rule, ShareSpec

RULES_VERSION = 1
_DEFAULT_RULES = Path(__file__).with_name("rules") / "default.yaml"
_RULE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9.-]+/[A-Za-z0-9._-]+$")


class RulesError(ValueError):
    """A rules file that cannot be used; the message names the file, rule and field."""


class TranslationRules:
    """An ordered list of rules; the first rule whose trigger matches a container wins."""

    def __init__(self, rules: Sequence[Rule], *, origin: str = "<rules>") -> None:
        self.rules = tuple(rules)
        self.origin = origin
        self.resources: frozenset[str] = frozenset().union(*(r.resources for r in self.rules))

    @classmethod
    def default(cls) -> TranslationRules:
        """The built-in rules (apis/rules/default.yaml)."""
        return _default_rules()

    @classmethod
    def load(cls, path: str) -> TranslationRules:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise RulesError(f"{path}: cannot read the rules file: {exc.strerror or exc}") from exc
        try:
            data = config_yaml.load_bytes(raw, origin=path)
        except config_yaml.YAMLFileError as exc:
            raise RulesError(f"{exc} (the translation rules file)") from None
        return cls.from_mapping(data, origin=path)

    @classmethod
    def from_yaml(cls, text: str, *, origin: str = "<rules>") -> TranslationRules:
        try:
            data = config_yaml.load_text(text, origin=origin)
        except config_yaml.YAMLFileError as exc:
            raise RulesError(str(exc)) from None
        return cls.from_mapping(data, origin=origin)

    @classmethod
    def from_mapping(cls, data: object, *, origin: str = "<rules>") -> TranslationRules:
        return cls(_parse_document(data, origin), origin=origin)

    def match(self, present: Collection[str]) -> Rule | None:
        """The first rule triggered by the resource names in `present`."""
        for rule in self.rules:
            if rule.matches(present):
                return rule
        return None

    def __repr__(self) -> str:
        return f"TranslationRules({[r.name for r in self.rules]!r}, origin={self.origin!r})"


@cache
def _default_rules() -> TranslationRules:
    return TranslationRules.load(str(_DEFAULT_RULES))


# --- parsing the YAML document ------------------------------------------------------------

_RULE_KEYS = {"name", "description", "when", "count", "core", "memory", "memoryRatio"}


def _parse_document(data: object, origin: str) -> list[Rule]:
    if not isinstance(data, Mapping):
        raise RulesError(f"{origin}: expected a mapping with 'version: {RULES_VERSION}' and 'rules: [...]'")
    _reject_unknown(data, {"version", "rules"}, f"{origin}")
    version = data.get("version")
    if type(version) is not int or version != RULES_VERSION:  # not `true` or 1.0, which compare equal to 1
        raise RulesError(f"{origin}: version: {data.get('version')!r} is not supported; write 'version: {RULES_VERSION}'")
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise RulesError(f"{origin}: rules: expected a non-empty list of rules")
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_rules):
        rule = _parse_rule(raw, f"{origin}: rules[{index}]")
        if rule.name in seen:
            raise RulesError(f"{origin}: rules[{index}] ({rule.name}): name is used twice; give each rule its own name")
        seen.add(rule.name)
        rules.append(rule)
    return rules


def _parse_rule(raw: object, where: str) -> Rule:
    if not isinstance(raw, Mapping):
        raise RulesError(f"{where}: expected a mapping with name, count/core/memory/memoryRatio")
    name = raw.get("name")
    if not isinstance(name, str) or not _RULE_NAME.match(name):
        raise RulesError(f"{where}: name: {name!r} is not a valid rule name; use lowercase letters, digits and '-'")
    if name == KOORDINATOR_SOURCE:
        raise RulesError(f"{where}: name: {name!r} is reserved for Koordinator's own resources; choose another")
    where = f"{where} ({name})"
    _reject_unknown(raw, _RULE_KEYS, where)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise RulesError(f"{where}: description: expected text, got {description!r}")
    count = _parse_count(raw.get("count"), f"{where}: count")
    core = _parse_share(raw.get("core"), f"{where}: core", memory=False)
    memory = _parse_share(raw.get("memory"), f"{where}: memory", memory=True)
    ratio = _parse_share(raw.get("memoryRatio"), f"{where}: memoryRatio", memory=False)
    if core is None and memory is None and ratio is None and count is None:
        raise RulesError(f"{where}: maps nothing; give at least one of count, core, memory, memoryRatio")
    used = [s.resource for s in (core, memory, ratio) if s is not None]
    if len(set(used)) != len(used):
        raise RulesError(f"{where}: one resource is mapped twice ({', '.join(used)}); map each resource once")
    when_any, when_all = _parse_when(raw.get("when"), f"{where}: when")
    if not when_any and not when_all:
        when_any = tuple(sorted(set(used) | ({count.resource} if count else set())))
    return Rule(
        name=name, description=description, when_any=when_any, when_all=when_all,
        count=count, core=core, memory=memory, memory_ratio=ratio,
    )


def _parse_when(raw: object, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if raw is None:
        return (), ()
    if not isinstance(raw, Mapping):
        raise RulesError(f"{where}: expected a mapping with 'any: [resources]' and/or 'all: [resources]'")
    _reject_unknown(raw, {"any", "all"}, where)
    lists = []
    for key in ("any", "all"):
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RulesError(f"{where}: {key}: expected a list of resource names, got {value!r}")
        for resource in value:
            _check_resource(resource, f"{where}: {key}")
        lists.append(tuple(value))
    if not lists[0] and not lists[1]:
        raise RulesError(f"{where}: lists no resource; give 'any: [...]' or 'all: [...]', or drop 'when'")
    return lists[0], lists[1]


def _parse_count(raw: object, where: str) -> CountSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise RulesError(f"{where}: expected a mapping like {{resource: vendor.example/gpu, default: 1}}")
    _reject_unknown(raw, {"resource", "default"}, where)
    resource = _check_resource(raw.get("resource"), f"{where}: resource")
    default = _int_field(raw.get("default"), f"{where}: default", low=1, high=None)
    return CountSpec(resource=resource, default=default)


def _parse_share(raw: object, where: str, *, memory: bool) -> ShareSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise RulesError(f"{where}: expected a mapping like {{resource: vendor.example/x, per: gpu}}")
    _reject_unknown(raw, {"resource", "per", "unit", "default"} if memory else {"resource", "per", "default"}, where)
    resource = _check_resource(raw.get("resource"), f"{where}: resource")
    per_text = raw.get("per", Per.GPU.value)
    try:
        per = Per(per_text)
    except ValueError:
        raise RulesError(f"{where}: per: {per_text!r} is not known; write 'gpu' or 'total'") from None
    unit = ""
    if memory:
        unit_text = raw.get("unit")
        if not isinstance(unit_text, str) or unit_text not in MEMORY_UNITS:
            raise RulesError(f"{where}: unit: {unit_text!r} is not known; write one of {', '.join(MEMORY_UNITS)}")
        unit = str(unit_text)
        if "default" in raw:
            raise RulesError(f"{where}: default: a memory size has no sensible default; remove it (use memoryRatio's default)")
        default = None
    else:
        default = _int_field(raw.get("default"), f"{where}: default", low=0, high=100 if per is Per.GPU else None)
    return ShareSpec(resource=resource, per=per, unit=unit, default=default)


def _int_field(raw: object, where: str, *, low: int, high: int | None) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < low or (high is not None and raw > high):
        bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise RulesError(f"{where}: {raw!r} is not valid; write a whole number {bounds}")
    return raw


def _check_resource(raw: object, where: str) -> str:
    if not isinstance(raw, str) or not _RESOURCE_NAME.match(raw):
        raise RulesError(f"{where}: {raw!r} is not an extended resource name; write it as 'domain/name'")
    if raw in names.KOORDINATOR_RESOURCES:
        raise RulesError(f"{where}: {raw} is a Koordinator resource fgpu reads natively; rules map other vendors' resources")
    return raw


def _reject_unknown(raw: Mapping[Any, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise RulesError(f"{where}: unknown field {', '.join(unknown)}; known fields are {', '.join(sorted(allowed))}")
