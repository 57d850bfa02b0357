"""What a policy declares it takes: its parameters and its options, each a frozen dataclass.

**Parameters** are the numeric knobs an operator sets (`policyParams` in the
scheduler's config, `--param` of `fgpuctl simulate`). Each is a field annotated
with `Param`; its type (`float` or `int`, optionally `| None`), default, range and
one-line description are what the config check, the error messages and the
documentation tables read::

    @dataclass(frozen=True)
    class UtilizationParams:
        weight_cpu: Annotated[float, Param("weight of CPU in the node's share in use")] = 1.0

A default of None means "not set": `Param.unset` says what the policy does
instead (e.g. learns the value). Rules across fields go in `__post_init__`,
raising ValueError with the fix; say them in words with the policy's `notes`.

**Options** are what code hands a policy (`PolicyContext.options`), e.g. the
simulator's target workload: fields annotated with `Option`, checked with
`isinstance` against their type.

`parse_params` and `parse_options` turn the raw mappings into these dataclasses;
every mistake names the policy, the key, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

ParamsT = TypeVar("ParamsT")
OptionsT = TypeVar("OptionsT")


@dataclass(frozen=True)
class Param:
    """Annotation of a parameter field: what it means and the values it takes."""

    doc: str
    minimum: float | None = 0.0
    maximum: float | None = None
    #: for a default of None: what the policy does when the parameter is not given
    unset: str = ""


@dataclass(frozen=True)
class Option:
    """Annotation of an option field: what it is for."""

    doc: str


@dataclass(frozen=True)
class NoParams:
    """A policy that takes no parameters."""


@dataclass(frozen=True)
class NoOptions:
    """A policy that takes no options."""


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter."""

    name: str
    kind: type[float] | type[int]
    default: float | None
    doc: str
    minimum: float | None
    maximum: float | None
    #: what the policy does when the parameter is not given and its default is None
    unset: str

    @property
    def default_text(self) -> str:
        return self.unset if self.default is None else f"{self.default:g}"

    @property
    def range_text(self) -> str:
        low = f">= {self.minimum:g}" if self.minimum is not None else ""
        high = f"<= {self.maximum:g}" if self.maximum is not None else ""
        return " and ".join(part for part in (low, high) if part)

    def fix(self) -> str:
        if self.default is None:
            return f"leave it out and it is {self.unset}"
        return f"leave it out for the default, {self.name}: {self.default:g}"

    def check(self, value: object, *, policy: str) -> float:
        """The value as the declared kind; ValueError naming the policy, the key, the value and the fix."""
        what = "a whole number" if self.kind is int else "a number"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"policy {policy!r}: {self.name}={value!r} must be {what}; {self.fix()}")
        number = float(value)
        low_ok = self.minimum is None or number >= self.minimum
        high_ok = self.maximum is None or number <= self.maximum
        if not (low_ok and high_ok) or number != number:  # NaN passes neither bound
            bounds = f" {self.range_text}" if self.range_text else ""
            raise ValueError(f"policy {policy!r}: {self.name}={value!r} must be {what}{bounds}; {self.fix()}")
        if self.kind is int:
            if not number.is_integer():
                raise ValueError(f"policy {policy!r}: {self.name}={value!r} must be {what}; {self.fix()}")
            return int(number)
        return number


@dataclass(frozen=True)
class OptionSpec:
    """One declared option."""

    name: str
    accepts: tuple[type, ...]
    default: object
    doc: str

    @property
    def type_text(self) -> str:
        return " or ".join(t.__name__ for t in self.accepts if t is not type(None)) or "None"


def _declared(cls: type[Any], marker: type[Any], *, policy: str) -> list[tuple[str, Any, Any, Any]]:
    """(name, type without the annotation, the `marker` instance, default) per field of a frozen dataclass."""
    what = "params" if marker is Param else "options"
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"policy {policy!r}: its {what} must be a frozen dataclass, got {cls!r}")
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except NameError as exc:
        raise TypeError(f"policy {policy!r}: cannot resolve the annotations of {cls.__name__} ({exc})") from None
    declared = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        extras = typing.get_args(hint)[1:] if typing.get_origin(hint) is typing.Annotated else ()
        found = [e for e in extras if isinstance(e, marker)]
        if not found:
            raise TypeError(
                f"policy {policy!r}: annotate {cls.__name__}.{f.name} as Annotated[<type>, {marker.__name__}(doc)]"
            )
        if f.default is dataclasses.MISSING:
            raise TypeError(f"policy {policy!r}: {what} {cls.__name__}.{f.name} has no default; give it one")
        declared.append((f.name, typing.get_args(hint)[0], found[0], f.default))
    return declared


def _members(annotation: Any) -> tuple[Any, ...]:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


def param_specs(cls: type[Any], *, policy: str) -> tuple[ParamSpec, ...]:
    """The parameters a params dataclass declares, in field order; TypeError when it is malformed."""
    specs = []
    for name, hint, declared, default in _declared(cls, Param, policy=policy):
        members = _members(hint)
        kinds = [m for m in members if m is not type(None)]
        optional = len(kinds) < len(members)
        if len(kinds) != 1 or kinds[0] not in (float, int) or (default is None) != optional:
            raise TypeError(
                f"policy {policy!r}: parameter {name} is declared as {hint} = {default!r}; declare it float or "
                "int with a number as default, or float | None / int | None with None and Param(unset=...)"
            )
        if default is None and not declared.unset:
            raise TypeError(f"policy {policy!r}: parameter {name} defaults to None; say in Param(unset=...) what then")
        specs.append(
            ParamSpec(
                name=name,
                kind=kinds[0],
                default=default,
                doc=declared.doc,
                minimum=declared.minimum,
                maximum=declared.maximum,
                unset=declared.unset,
            )
        )
    return tuple(specs)


def option_specs(cls: type[Any], *, policy: str) -> tuple[OptionSpec, ...]:
    """The options an options dataclass declares, in field order; TypeError when it is malformed."""
    specs = []
    for name, hint, declared, default in _declared(cls, Option, policy=policy):
        accepts = []
        for member in _members(hint):
            concrete = object if member is Any else typing.get_origin(member) or member
            if not isinstance(concrete, type):
                raise TypeError(f"policy {policy!r}: option {name} is declared as {hint}; use classes")
            accepts.append(concrete)
        specs.append(OptionSpec(name=name, accepts=tuple(accepts), default=default, doc=declared.doc))
    return tuple(specs)


def parse_params(
    cls: type[ParamsT], specs: tuple[ParamSpec, ...], raw: Mapping[str, object], *, policy: str
) -> ParamsT:
    """`raw` as `cls`: unknown names, wrong types and ranges refused; `cls`'s own rules run last."""
    unknown = sorted(set(raw) - {s.name for s in specs})
    if unknown:
        known = ", ".join(s.name for s in specs) or "none"
        raise ValueError(f"policy {policy!r}: unknown parameter(s) {', '.join(unknown)}; known: {known}")
    values = {s.name: s.check(raw[s.name], policy=policy) for s in specs if s.name in raw}
    try:
        return cls(**values)
    except ValueError as exc:
        raise ValueError(f"policy {policy!r}: {exc}") from None


def parse_options(
    cls: type[OptionsT], specs: tuple[OptionSpec, ...], raw: Mapping[str, object], *, policy: str
) -> OptionsT:
    """The declared options found in `raw` as `cls`; options the policy does not declare are not its business."""
    values = {}
    for spec in specs:
        if spec.name not in raw:
            continue
        value = raw[spec.name]
        if not isinstance(value, spec.accepts):
            raise TypeError(
                f"policy {policy!r}: options[{spec.name!r}] is a {type(value).__name__}; pass a {spec.type_text}"
            )
        values[spec.name] = value
    return cls(**values)
