"""Translation rules: how other GPU-sharing products' resources map onto fgpu's request.

A rule is config, not code: each names the resources that trigger it and how
they map onto the Koordinator protocol (GPU count, core percent, memory from
a unit, memory ratio), with defaults. The built-in rules (HAMi, NVIDIA device
plugin, Aliyun, Volcano, Tencent qGPU) are in `apis/rules/default.yaml`; the
format is documented in docs/translation-rules.md. Translating to Koordinator
amounts (rather than straight to a DeviceRequest) lets every pod, whatever
product it was written for, go through the one validation in apis/request.py.

Example rule::

    - name: hami
      when: {any: [nvidia.com/gpumem, nvidia.com/gpucores]}
      count: {resource: nvidia.com/gpu, default: 1}
      core: {resource: nvidia.com/gpucores, per: gpu, default: 0}
      memory: {resource: nvidia.com/gpumem, unit: Mi, per: gpu}
"""

from __future__ import annotations

import enum
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from apis import names

log = logging.getLogger(__name__)

RULES_VERSION = 1
_DEFAULT_RULES = Path(__file__).with_name("rules") / "default.yaml"
_UNITS = {"bytes": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_RULE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9.-]+/[A-Za-z0-9._-]+$")
#: The name under which requests written in Koordinator's own resources are reported.
KOORDINATOR_SOURCE = "koordinator"


class RulesError(ValueError):
    """A rules file that cannot be used; the message names the file, rule and field."""


class Per(enum.Enum):
    """What a share amount is counted over."""

    #: The amount applies to each of the pod's GPUs (HAMi gpucores: 30 = 30% of each card).
    GPU = "gpu"
    #: The amount is the pod's total, 100 per whole card (qGPU qgpu-core: 200 = two cards).
    TOTAL = "total"


@dataclass(frozen=True)
class CountSpec:
    """The resource giving the number of GPUs; `default` when it is absent (None: required)."""

    resource: str
    default: int | None = None


@dataclass(frozen=True)
class ShareSpec:
    """One share amount: a percent (core, memory ratio) or a memory size in `unit`."""

    resource: str
    per: Per = Per.GPU
    #: "" for percents; a key of _UNITS for memory.
    unit: str = ""
    #: Used when the pod leaves the resource out (None: no default).
    default: int | None = None


@dataclass(frozen=True)
class Term:
    """How a Koordinator amount is shown in messages: the resource the pod wrote, and its value."""

    resource: str
    text: str


@dataclass(frozen=True)
class Translated:
    """A container's vendor request in Koordinator amounts (resource name -> integer amount)."""

    amounts: Mapping[str, int]
    terms: Mapping[str, Term]
    errors: tuple[str, ...] = ()


def problem(*, where: str, resource: str, value: object, what: str, fix: str) -> str:
    """One validation message: where, which resource, which value, what is wrong, how to fix it."""
    return f"{where}: {resource}={value}: {what}; {fix}"


@dataclass(frozen=True)
class Rule:
    name: str
    when_any: tuple[str, ...] = ()
    when_all: tuple[str, ...] = ()
    count: CountSpec | None = None
    core: ShareSpec | None = None
    memory: ShareSpec | None = None
    memory_ratio: ShareSpec | None = None
    description: str = ""

    @property
    def shares(self) -> tuple[ShareSpec, ...]:
        return tuple(s for s in (self.core, self.memory, self.memory_ratio) if s is not None)

    @property
    def resources(self) -> frozenset[str]:
        named = {s.resource for s in self.shares}
        if self.count is not None:
            named.add(self.count.resource)
        return frozenset(named | set(self.when_any) | set(self.when_all))

    def matches(self, present: Collection[str]) -> bool:
        if self.when_all and not all(r in present for r in self.when_all):
            return False
        return not self.when_any or any(r in present for r in self.when_any)

    def translate(self, *, where: str, values: Mapping[str, int], raw: Mapping[str, str]) -> Translated:
        """Maps a container's values of this rule's resources (positive integers) to Koordinator amounts."""
        errors: list[str] = []
        amounts: dict[str, int] = {}
        terms: dict[str, Term] = {}

        count: int | None = None
        if self.count is not None:
            count = values.get(self.count.resource, self.count.default)
            if count is None:
                errors.append(
                    f"{where}: {self.count.resource} is missing: the {self.name} rule needs the number of GPUs; "
                    f"add {self.count.resource} (e.g. 1)"
                )
                return Translated({}, {}, tuple(errors))
            terms[names.GPU_SHARED] = Term(self.count.resource, raw.get(self.count.resource, str(count)))

        if not any(s.resource in values for s in self.shares):
            # Only the count was given: whole GPUs, as the device plugin means it.
            amounts[names.KOORD_GPU] = 100 * (count or 1)  # koordinator.sh/gpu is in percent of a card
            shown = self.count.resource if self.count is not None else "/".join(sorted(self.when_any))
            terms[names.KOORD_GPU] = Term(shown, raw.get(shown, str(count or 1)))
            return Translated(amounts, terms)

        cards = count or 1
        if count is not None:
            amounts[names.GPU_SHARED] = count
        memory_given = False
        for target, spec in (
            (names.GPU_CORE, self.core),
            (names.GPU_MEMORY, self.memory),
            (names.GPU_MEMORY_RATIO, self.memory_ratio),
        ):
            if spec is None:
                continue
            value = values.get(spec.resource)
            text = raw.get(spec.resource, "")
            if value is None:
                if spec.default is None or spec.default == 0:
                    continue
                if target == names.GPU_MEMORY_RATIO and memory_given:
                    continue  # the default ratio stands in only for a missing memory amount
                value, text = spec.default, f"{spec.default} (default)"
            if target == names.GPU_MEMORY:
                if spec.unit != "bytes" and not text.strip().isdigit():
                    in_units = value // _UNITS[spec.unit]
                    errors.append(
                        problem(
                            where=where, resource=spec.resource, value=text,
                            what=f"is counted in {spec.unit} by the {self.name} rule",
                            fix=f"write a plain number of {spec.unit}, e.g. {in_units or 1}",
                        )
                    )
                    continue
                value *= _UNITS[spec.unit]
                memory_given = True
            elif spec.per is Per.GPU and value > 100:
                errors.append(
                    problem(
                        where=where, resource=spec.resource, value=text,
                        what="is a percent of each GPU and cannot exceed 100",
                        fix=f"ask for at most 100 (more GPUs come from {self._count_name()})",
                    )
                )
                continue
            amounts[target] = value * cards if spec.per is Per.GPU else value
            terms[target] = Term(spec.resource, text)
        return Translated(amounts, terms, tuple(errors))

    def memory_hint(self) -> str:
        """How to add memory to a request in this rule's resources (for "core alone" messages)."""
        options = []
        if self.memory_ratio is not None:
            options.append(f"{self.memory_ratio.resource} (percent, e.g. 50)")
        if self.memory is not None:
            unit = "bytes" if self.memory.unit == "bytes" else self.memory.unit
            example = "10Gi" if self.memory.unit == "bytes" else str(10 * 2**30 // _UNITS[self.memory.unit] or 1)
            options.append(f"{self.memory.resource} (in {unit}, e.g. {example})")
        return " or ".join(options) or "a memory resource to this rule"

    def _count_name(self) -> str:
        return self.count.resource if self.count is not None else "the GPU count"


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
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise RulesError(f"{path}: cannot read the rules file: {exc.strerror or exc}") from exc
        return cls.from_yaml(text, origin=path)

    @classmethod
    def from_yaml(cls, text: str, *, origin: str = "<rules>") -> TranslationRules:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RulesError(f"{origin}: not valid YAML: {exc}") from exc
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
    if data.get("version") != RULES_VERSION:
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
        if unit_text not in _UNITS:
            raise RulesError(f"{where}: unit: {unit_text!r} is not known; write one of {', '.join(_UNITS)}")
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


# --- hot reload -----------------------------------------------------------------------------


class RulesWatcher:
    """The rules of one file, re-read when the file changes; a bad edit keeps the last good rules.

    `current()` looks at the file at most every `min_interval_s` (a stat call),
    so callers on the hot path can ask for every pod. A ConfigMap volume swaps a
    symlink on update; stat follows it, so the swap shows as a change.
    """

    def __init__(
        self,
        path: str,
        *,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._signature = self._stat()
        self._rules = TranslationRules.load(path)  # a bad file at start is the operator's to fix now
        self._checked_at = clock()
        #: Why the latest change was not applied; None after a good load.
        self.last_error: str | None = None
        self.reloads = 0

    def current(self) -> TranslationRules:
        now = self._clock()
        with self._lock:
            if now - self._checked_at >= self._min_interval_s:
                self._checked_at = now
                self._maybe_reload()
            return self._rules

    def _maybe_reload(self) -> None:
        signature = self._stat()
        if signature == self._signature:
            return
        self._signature = signature
        try:
            rules = TranslationRules.load(self.path)
        except RulesError as exc:
            if str(exc) != self.last_error:
                log.warning("keeping the previous translation rules: %s", exc)
            self.last_error = str(exc)
            return
        self._rules = rules
        self.last_error = None
        self.reloads += 1
        log.info("reloaded translation rules from %s: %s", self.path, [r.name for r in rules.rules])

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

