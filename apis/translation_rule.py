"""One translation rule: the resources that trigger it and how it maps them onto Koordinator amounts.

A rule maps another GPU-sharing product's resources onto the Koordinator
protocol (GPU count, core percent, memory from a unit, memory ratio), with
defaults. The rules file that lists them is read by apis/rules_file.py.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from apis import names
from apis.quantity import QuantityError, parse_quantity

#: Units a memory amount may be counted in, in bytes.
MEMORY_UNITS = {"bytes": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
#: The name under which requests written in Koordinator's own resources are reported.
KOORDINATOR_SOURCE = "koordinator"


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
    #: "" for percents; a key of MEMORY_UNITS for memory.
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
                if spec.unit != "bytes" and spec.resource in values and _binary_suffixed(text):
                    errors.append(
                        problem(
                            where=where, resource=spec.resource, value=text,
                            what=f"is counted in {spec.unit} by the {self.name} rule, so a binary suffix "
                            "would multiply the count",
                            fix=f"write a number of {spec.unit} without Ki..Ei, e.g. {_in_units(value, spec.unit)}",
                        )
                    )
                    continue
                value *= MEMORY_UNITS[spec.unit]
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
            example = "10Gi" if self.memory.unit == "bytes" else str(10 * 2**30 // MEMORY_UNITS[self.memory.unit] or 1)
            options.append(f"{self.memory.resource} (in {unit}, e.g. {example})")
        return " or ".join(options) or "a memory resource to this rule"

    def _count_name(self) -> str:
        return self.count.resource if self.count is not None else "the GPU count"


_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def _binary_suffixed(text: str) -> bool:
    """Whether a memory count carries a binary suffix ("4Gi"): it then reads as bytes, not as a count of the unit.

    A decimal suffix or an exponent stays a plain count: the API server re-emits
    every quantity in canonical form, so HAMi's `gpumem: 4000` arrives as "4k"
    (and 1e6 as "1M"); the count itself was already parsed as a whole number.
    """
    stripped = text.strip()
    try:
        parse_quantity(stripped)
    except QuantityError:
        return False
    return stripped.endswith(_BINARY_SUFFIXES)


def _in_units(size: int, unit: str) -> str:
    """A binary-suffixed size ("4Gi", read as bytes) as a count of `unit`, rounded up to a whole one if need be."""
    factor = MEMORY_UNITS[unit]
    return str(max(1, -(-size // factor)))
