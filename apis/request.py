"""A Pod's GPU request, normalized: how many cards, and what share of each.

Pods ask in Koordinator's resources (`koordinator.sh/gpu-core: 50` +
`koordinator.sh/gpu-memory: 10Gi`), as whole GPUs (`nvidia.com/gpu: 2`) or in
another product's resources, which the translation rules map onto
Koordinator's first. Every request then passes the same checks, and each
failure is one message naming the container, the resource, the value and the
fix. Containers combine with Kubernetes' effective-request rule, per resource,
as the scheduler counts them.

This module reads the pod; the request value (`DeviceRequest`, `RequestError`)
is in apis/device_request.py and the checks in apis/request_checks.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from apis import names
from apis.device_request import DeviceRequest, RequestError
from apis.pods import (
    ContainerKind,
    ContainerResources,
    PodShapeError,
    container_resources,
    effective_requests,
    pod_overhead,
)
from apis.quantity import format_bytes, parse_quantity
from apis.request_checks import derive_request
from apis.translation import KOORDINATOR_SOURCE, Term, TranslationRules, problem

__all__ = ["ContainerRequest", "DeviceRequest", "RequestError", "container_requests", "parse_pod", "pod_cpu_memory"]


@dataclass(frozen=True)
class ContainerRequest:
    """One container's own GPU request, for splitting the pod's allocation among its containers."""

    name: str
    kind: ContainerKind
    request: DeviceRequest


def container_requests(pod: Mapping[str, Any] | Any, *, rules: TranslationRules | None = None) -> list[ContainerRequest]:
    """Each container that asks for GPUs, with its own request (init containers first, in spec order).

    Raises RequestError when a container's request is invalid, as parse_pod does.
    """
    rules = rules if rules is not None else TranslationRules.default()
    errors: list[str] = []
    out: list[ContainerRequest] = []
    for container in _containers(pod):
        part = _container_part(container, rules, errors)
        if part is not None:
            out.append(ContainerRequest(name=part.name, kind=part.kind, request=part.request))
    if errors:
        raise RequestError(errors)
    return out


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
    combined = derive_request(amounts=total, terms=terms, where=where, source=sources[0], errors=errors)
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
    request = derive_request(amounts=amounts, terms=terms, where=where, source=source, errors=errors, memory_hint=memory_hint)
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

def _first_term(part: _Part) -> str:
    term = next(iter(part.terms.values()))
    return f"{term.resource}={term.text}"


def _total_term(resource: str, value: int, parts: Sequence[_Part]) -> Term:
    name = next((p.terms[resource].resource for p in parts if resource in p.terms), resource)
    text = format_bytes(value) if resource == names.GPU_MEMORY else str(value)
    return Term(name, f"{text} (sum)")
