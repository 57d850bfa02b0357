"""A Pod's GPU request, normalized: how many cards, and what share of each.

Pods ask in Koordinator's resources (`koordinator.sh/gpu-core: 50` +
`koordinator.sh/gpu-memory: 10Gi`), as whole GPUs (`nvidia.com/gpu: 2`) or in
another product's resources, which the translation rules map onto
Koordinator's first. Every request then passes the same checks, and each
failure is one message naming the container, the resource, the value and the
fix. Containers combine with Kubernetes' effective-request rule, per resource,
as the scheduler counts them.

Example, `DeviceRequest.to_json()` of `gpu-core: 100, gpu-memory-ratio: 100, gpu.shared: 2`::

    {"gpus": 2, "core_percent": 50, "memory_bytes": null, "memory_ratio_percent": 50,
     "whole": false, "source": "koordinator"}
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from apis import names
from apis.pods import (
    ContainerKind,
    ContainerResources,
    PodShapeError,
    container_resources,
    effective_requests,
    pod_overhead,
)
from apis.quantity import format_bytes, parse_quantity
from apis.translation import KOORDINATOR_SOURCE, Term, TranslationRules, problem

_PERCENTS = (names.GPU_CORE, names.GPU_MEMORY_RATIO)


@dataclass(frozen=True)
class DeviceRequest:
    """The GPUs a pod needs: `gpus` cards, each with the same share."""

    gpus: int
    #: Per card, 0..100; 0 asks for memory only.
    core_percent: int
    #: Per card, when the pod asked for bytes.
    memory_bytes: int | None
    #: Per card, when the pod asked for a ratio (100 for whole GPUs).
    memory_ratio_percent: int | None
    #: Each card is taken entirely: all of its compute and memory.
    whole: bool
    #: The rule that produced it: "koordinator", "nvidia", "hami", ...
    source: str

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"DeviceRequest.gpus: {self.gpus} must be at least 1")
        if not 0 <= self.core_percent <= 100:
            raise ValueError(f"DeviceRequest.core_percent: {self.core_percent} must be 0..100")
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise ValueError(f"DeviceRequest.memory_bytes: {self.memory_bytes} must be positive")
        if self.memory_ratio_percent is not None and not 1 <= self.memory_ratio_percent <= 100:
            raise ValueError(f"DeviceRequest.memory_ratio_percent: {self.memory_ratio_percent} must be 1..100")
        if self.memory_bytes is not None and self.memory_ratio_percent is not None:
            raise ValueError("DeviceRequest: give memory_bytes or memory_ratio_percent, not both")
        if self.memory_bytes is None and self.memory_ratio_percent is None:
            raise ValueError("DeviceRequest: one of memory_bytes or memory_ratio_percent is needed")
        if self.whole and (self.core_percent != 100 or self.memory_ratio_percent != 100):
            raise ValueError("DeviceRequest: whole=True needs core_percent=100 and memory_ratio_percent=100")

    def memory_bytes_on(self, gpu_memory_bytes: int) -> int:
        """The bytes this request takes on each card of `gpu_memory_bytes` memory."""
        if self.memory_bytes is not None:
            return self.memory_bytes
        assert self.memory_ratio_percent is not None  # __post_init__ guarantees one of the two
        return gpu_memory_bytes * self.memory_ratio_percent // 100

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": self.gpus,
            "core_percent": self.core_percent,
            "memory_bytes": self.memory_bytes,
            "memory_ratio_percent": self.memory_ratio_percent,
            "whole": self.whole,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> DeviceRequest:
        """The inverse of to_json; a missing or mistyped field raises ValueError naming it."""

        def number(key: str, *, optional: bool = False) -> Any:
            value = data.get(key)
            if value is None and optional:
                return None
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"DeviceRequest JSON: {key}: expected a whole number, got {value!r}")
            return value

        whole = data.get("whole", False)
        source = data.get("source", "")
        if not isinstance(whole, bool):
            raise ValueError(f"DeviceRequest JSON: whole: expected true or false, got {whole!r}")
        if not isinstance(source, str):
            raise ValueError(f"DeviceRequest JSON: source: expected text, got {source!r}")
        return cls(
            gpus=number("gpus"),
            core_percent=number("core_percent"),
            memory_bytes=number("memory_bytes", optional=True),
            memory_ratio_percent=number("memory_ratio_percent", optional=True),
            whole=whole,
            source=source,
        )


class RequestError(ValueError):
    """An invalid request; `errors` holds one message per problem."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


def parse_pod(pod: Mapping[str, Any] | Any, *, rules: TranslationRules | None = None) -> DeviceRequest | None:
    """The pod's GPU request; None when it asks for none. Raises RequestError when invalid."""
    rules = rules if rules is not None else TranslationRules.default()
    errors: list[str] = []
    parts: list[_Part] = []
    for container in _containers(pod):
        part = _container_part(container, rules, errors)
        if part is not None:
            parts.append(part)
    if errors:
        raise RequestError(errors)
    if not parts:
        return None
    sources = sorted({p.source for p in parts})
    if len(sources) > 1:
        styles = ", ".join(f"{p.where} asks as {p.source} ({_first_term(p)})" for p in parts)
        raise RequestError(
            [f"{styles}: containers of one pod must ask for GPUs in one style; write them all in the same resources"]
        )
    if len(parts) == 1:
        return parts[0].request
    total = effective_requests((p.kind, p.amounts) for p in parts)
    terms = {key: _total_term(key, value, parts) for key, value in total.items()}
    where = "containers " + ", ".join(f'"{p.name}"' for p in parts) + " together"
    combined = _derive(total, terms, where=where, source=sources[0], errors=errors)
    if combined is None:
        raise RequestError(errors)
    return combined


def pod_cpu_memory(pod: Mapping[str, Any] | Any) -> tuple[int, int]:
    """The pod's effective (CPU millicores, memory bytes) requests, init containers and overhead included."""
    errors: list[str] = []
    per_container: list[tuple[ContainerKind, dict[str, Fraction]]] = []
    for container in _containers(pod):
        amounts: dict[str, Fraction] = {}
        for resource in ("cpu", "memory"):
            # Kubernetes defaults a missing request to the limit.
            raw = container.requests.get(resource, container.limits.get(resource))
            if raw is None:
                continue
            try:
                value = _quantity(raw, resource)
            except ValueError:
                errors.append(
                    problem(where=_where(container), resource=resource, value=raw,
                            what="is not a quantity", fix="write e.g. 500m or 2 for cpu, 512Mi or 4Gi for memory")
                )
                continue
            if value < 0:
                errors.append(
                    problem(where=_where(container), resource=resource, value=raw,
                            what="is negative", fix="ask for zero or more")
                )
                continue
            amounts[resource] = value
        per_container.append((container.kind, amounts))
    if errors:
        raise RequestError(errors)
    total = effective_requests(per_container)
    overhead = pod_overhead(pod)
    for resource in ("cpu", "memory"):
        if resource in overhead:
            try:
                total[resource] = total.get(resource, Fraction(0)) + _quantity(overhead[resource], resource)
            except ValueError as exc:
                raise RequestError([f"spec.overhead: {resource}={overhead[resource]}: {exc}; write a quantity such as 100m"]) from exc
    return math.ceil(total.get("cpu", Fraction(0)) * 1000), math.ceil(total.get("memory", Fraction(0)))


# --- one container --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    """A container that asks for GPUs, in Koordinator amounts."""

    name: str
    where: str
    kind: ContainerKind
    source: str
    amounts: Mapping[str, int]
    terms: Mapping[str, Term]
    request: DeviceRequest


def _containers(pod: Mapping[str, Any] | Any) -> list[ContainerResources]:
    try:
        return container_resources(pod)
    except PodShapeError as exc:
        raise RequestError([f"{exc}; write the pod as Kubernetes does (see examples/pods/)"]) from exc


def _where(container: ContainerResources) -> str:
    label = "container" if container.kind is ContainerKind.APP else "init container"
    return f'{label} "{container.name}"'


def _container_part(container: ContainerResources, rules: TranslationRules, errors: list[str]) -> _Part | None:
    where = _where(container)
    koord = [r for r in names.KOORDINATOR_RESOURCES if r in container.requests or r in container.limits]
    vendor = sorted(r for r in rules.resources if r in container.requests or r in container.limits)
    if not koord and not vendor:
        return None
    first_errors = len(errors)
    values, raw = _values(container, [*koord, *vendor], errors)
    if koord and vendor:
        errors.append(
            problem(
                where=where, resource=vendor[0], value=raw.get(vendor[0], "?"),
                what=f"is another product's resource, and the container also asks for {koord[0]}={raw.get(koord[0], '?')}: "
                "a vendor resource mixed with koordinator resources is invalid",
                fix=f"ask in one style only: either Koordinator's resources or {vendor[0]} and its companions",
            )
        )
    if len(errors) > first_errors:
        return None
    memory_hint = ""
    if koord:
        source = KOORDINATOR_SOURCE
        amounts: Mapping[str, int] = values
        terms: Mapping[str, Term] = {r: Term(r, raw[r]) for r in values}
    else:
        rule = rules.match(vendor)
        if rule is None:
            triggers = sorted({t for r in rules.rules if vendor[0] in r.resources for t in (*r.when_any, *r.when_all)})
            errors.append(
                problem(where=where, resource=vendor[0], value=raw[vendor[0]],
                        what="does not trigger any translation rule on its own",
                        fix=f"add {' or '.join(triggers) or 'the resource its rule is triggered by'}, or remove it")
            )
            return None
        strays = [r for r in vendor if r not in rule.resources]
        for stray in strays:
            errors.append(
                problem(where=where, resource=stray, value=raw[stray],
                        what=f"is not part of the {rule.name} rule, which this container's resources follow "
                        f"({', '.join(sorted(r for r in vendor if r in rule.resources))})",
                        fix="ask in one product's resources only")
            )
        translated = rule.translate(where=where, values=values, raw=raw)
        errors.extend(translated.errors)
        if strays or translated.errors:
            return None
        source, amounts, terms = rule.name, translated.amounts, translated.terms
        memory_hint = rule.memory_hint()
    request = _derive(amounts, terms, where=where, source=source, errors=errors, memory_hint=memory_hint)
    if request is None:
        return None
    return _Part(container.name, where, container.kind, source, amounts, terms, request)


def _values(container: ContainerResources, resources: Sequence[str], errors: list[str]) -> tuple[dict[str, int], dict[str, str]]:
    """Positive whole values of the resources (limits if given, as Kubernetes defaults requests)."""
    where = _where(container)
    values: dict[str, int] = {}
    raw_text: dict[str, str] = {}
    for resource in resources:
        request, limit = container.requests.get(resource), container.limits.get(resource)
        raw = limit if limit is not None else request
        raw_text[resource] = str(raw)
        parsed = _positive_whole(resource, raw, where, errors)
        if parsed is None:
            continue
        if request is not None and limit is not None:
            other = _positive_whole(resource, request, where, errors)
            if other is None:
                continue
            if other != parsed:
                errors.append(
                    problem(where=where, resource=resource, value=f"{request} (requests) vs {limit} (limits)",
                            what="limits must equal requests for an extended resource",
                            fix=f"set both to the same value, or give only limits: {limit}")
                )
                continue
        values[resource] = parsed
    return values, raw_text


_HUGE_EXPONENT = re.compile(r"[eE][+-]?\d{3,}")


def _quantity(raw: object, resource: str) -> Fraction:
    """parse_quantity, refusing exponents that would take ages to expand ("1e999999999")."""
    if isinstance(raw, str) and _HUGE_EXPONENT.search(raw):
        raise ValueError(f"{resource}: {raw!r} has an exponent too large for any resource")
    if isinstance(raw, float) and not math.isfinite(raw):
        raise ValueError(f"{resource}: {raw!r} is not a finite number")
    return parse_quantity(raw, field=resource)


def _positive_whole(resource: str, raw: object, where: str, errors: list[str]) -> int | None:
    example = "20Gi" if resource == names.GPU_MEMORY else "50"
    try:
        value = _quantity(raw, resource)
    except ValueError:
        errors.append(problem(where=where, resource=resource, value=raw, what="is not a number",
                              fix=f"write a whole number such as {example}"))
        return None
    if value <= 0:
        errors.append(problem(where=where, resource=resource, value=raw, what="must be positive",
                              fix=f"ask for at least 1, or remove {resource} to ask for none"))
        return None
    if value.denominator != 1:
        errors.append(problem(where=where, resource=resource, value=raw, what="is fractional",
                              fix=f"write a whole number such as {example}"))
        return None
    return int(value)


# --- Koordinator amounts -> DeviceRequest ------------------------------------------------------


def _derive(
    amounts: Mapping[str, int],
    terms: Mapping[str, Term],
    *,
    where: str,
    source: str,
    errors: list[str],
    memory_hint: str = "",
) -> DeviceRequest | None:
    """Checks a request in Koordinator's terms and splits it over its cards."""
    start = len(errors)
    if not memory_hint:
        memory_hint = f"{names.GPU_MEMORY_RATIO} (e.g. {amounts.get(names.GPU_CORE, 50)}) or {names.GPU_MEMORY} (e.g. 10Gi)"

    def fail(resource: str, what: str, fix: str) -> None:
        term = terms.get(resource, Term(resource, str(amounts.get(resource))))
        errors.append(problem(where=where, resource=term.resource, value=term.text, what=what, fix=fix))

    def shown(resource: str) -> str:
        return terms[resource].resource if resource in terms else resource

    whole = amounts.get(names.KOORD_GPU)
    core, memory = amounts.get(names.GPU_CORE), amounts.get(names.GPU_MEMORY)
    ratio, shared = amounts.get(names.GPU_MEMORY_RATIO), amounts.get(names.GPU_SHARED)
    if whole is not None:
        others = [shown(r) for r in (names.GPU_CORE, names.GPU_MEMORY, names.GPU_MEMORY_RATIO, names.GPU_SHARED) if r in amounts]
        if others:
            fail(names.KOORD_GPU, f"is a share in percent of a card (compute and memory together) and cannot be combined with {', '.join(others)}",
                 f"ask either with {shown(names.KOORD_GPU)} alone (100 = one whole GPU), or with {names.GPU_CORE} and a memory resource without it")
            return None
        # Koordinator's koordinator.sh/gpu is a percentage of one card that stands for both
        # compute and memory ratio (100 = one whole GPU, 50 = half of one, 200 = two whole).
        core = ratio = whole
        amounts = {**amounts, names.GPU_CORE: whole, names.GPU_MEMORY_RATIO: whole}
        if names.KOORD_GPU in terms:
            terms = {**terms, names.GPU_CORE: terms[names.KOORD_GPU], names.GPU_MEMORY_RATIO: terms[names.KOORD_GPU]}
    elif core is None and memory is None and ratio is None:
        if shared is not None:
            fail(names.GPU_SHARED, "spreads a share over cards but no share is asked for",
                 f"add {names.GPU_CORE} and {names.GPU_MEMORY_RATIO} (or {names.GPU_MEMORY}), or remove it")
        return None
    if memory is not None and ratio is not None:
        ratio_text = terms[names.GPU_MEMORY_RATIO].text if names.GPU_MEMORY_RATIO in terms else ratio
        fail(names.GPU_MEMORY, f"is given together with {shown(names.GPU_MEMORY_RATIO)}={ratio_text}: "
             "memory and memory-ratio together are invalid",
             f"keep only one of {shown(names.GPU_MEMORY)} and {shown(names.GPU_MEMORY_RATIO)}")
    if core is not None and memory is None and ratio is None:
        fail(names.GPU_CORE, "asks for compute without memory: core alone is invalid", f"add {memory_hint}")
    if len(errors) > start:
        return None

    if shared is not None:
        gpus = shared
        for resource in _PERCENTS:
            value = amounts.get(resource)
            if value is None:
                continue
            if value % shared:
                fail(resource, f"is not a multiple of {shown(names.GPU_SHARED)}={shared}, so it does not split evenly over the cards",
                     f"ask for a multiple of {shared}, e.g. {_multiples_near(value, shared)}")
            elif value // shared > 100:
                fail(resource, f"is more than 100 per card over {shared} cards",
                     f"ask for at most {100 * shared}, or raise {shown(names.GPU_SHARED)}")
    else:
        counts: dict[str, int] = {}
        for resource in _PERCENTS:
            value = amounts.get(resource)
            if value is None:
                continue
            if value > 100 and value % 100:
                fail(resource, "is above 100 but not a multiple of 100: a percentage above 100 must be a multiple of 100 "
                     "(a share of one card, or whole cards)",
                     f"ask for {value // 100 * 100} or {(value // 100 + 1) * 100}, or for at most 100")
                continue
            counts[resource] = value // 100 if value > 100 else 1
        if len(set(counts.values())) > 1:
            fail(names.GPU_CORE, f"asks for {counts[names.GPU_CORE]} card(s) but "
                 f"{shown(names.GPU_MEMORY_RATIO)}={terms[names.GPU_MEMORY_RATIO].text} for {counts[names.GPU_MEMORY_RATIO]}",
                 f"make both ask for the same number of cards, or spread a share with {names.GPU_SHARED}")
        gpus = max(counts.values(), default=1)
    if memory is not None and not len(errors) > start and memory % gpus:
        fail(names.GPU_MEMORY, f"does not split evenly over {gpus} cards",
             f"ask for a multiple of {gpus} bytes, e.g. {format_bytes(memory - memory % gpus)}")
    if len(errors) > start:
        return None
    core_each = (core or 0) // gpus
    ratio_each = ratio // gpus if ratio is not None else None
    return DeviceRequest(
        gpus=gpus,
        core_percent=core_each,
        memory_bytes=memory // gpus if memory is not None else None,
        memory_ratio_percent=ratio_each,
        whole=core_each == 100 and ratio_each == 100,
        source=source,
    )


def _first_term(part: _Part) -> str:
    term = next(iter(part.terms.values()))
    return f"{term.resource}={term.text}"


def _total_term(resource: str, value: int, parts: Sequence[_Part]) -> Term:
    name = next((p.terms[resource].resource for p in parts if resource in p.terms), resource)
    text = format_bytes(value) if resource == names.GPU_MEMORY else str(value)
    return Term(name, f"{text} (sum)")


def _multiples_near(value: int, step: int) -> str:
    below = value - value % step
    return f"{below} or {below + step}" if below else str(step)
