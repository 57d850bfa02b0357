"""A Pod's GPU request, normalized: how many cards, and what share of each.

Pods ask in Koordinator's resources (`koordinator.sh/gpu-core: 50` +
`koordinator.sh/gpu-memory: 10Gi`), as whole GPUs (`nvidia.com/gpu: 2`) or in
another product's resources, which the translation rules map onto
Koordinator's first. Every request then passes the same checks, and each
failure is one message naming the container, the resource, the value and the
fix. Containers combine with Kubernetes' effective-request rule, per resource,
as the scheduler counts them, and, as in Koordinator, the checks apply to that
sum: a zero quantity counts as not written, and a container need not be a
valid request on its own. Each container's own part, for splitting the pod's
GPUs among them, is `container_requests`.

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

from apis import names, overcommit
from apis.allocation import Allocation, GPUShare
from apis.container_split import SplitError, split_allocation
from apis.device_request import ContainerRequest, DeviceRequest, RequestError
from apis.pods import (
    ContainerKind,
    ContainerResources,
    PodShapeError,
    as_pod_dict,
    container_resources,
    effective_requests,
    pod_overhead,
)
from apis.quantity import format_bytes, parse_quantity
from apis.request_checks import derive_request, spread_request
from apis.translation import KOORDINATOR_SOURCE, Term, TranslationRules, problem

__all__ = ["ContainerRequest", "DeviceRequest", "RequestError", "container_requests", "parse_pod", "pod_cpu_memory"]


def container_requests(pod: Mapping[str, Any] | Any, *, rules: TranslationRules | None = None) -> list[ContainerRequest]:
    """Each container that asks for GPUs, with its own part (init containers first, in spec order).

    The parts always lay out together on the pod's request (`apis.container_split`).
    A container's part is its own request when every GPU container's own request
    is valid alone and they lay out together; otherwise every GPU container gets
    its own amounts spread evenly over all the pod's cards (`spread_request`).
    Raises RequestError when the pod is invalid, as parse_pod does (parse_pod
    also refuses a pod whose containers cannot share its cards).
    """
    return _read(pod, rules)[1]


def parse_pod(pod: Mapping[str, Any] | Any, *, rules: TranslationRules | None = None) -> DeviceRequest | None:
    """The pod's GPU request; None when it asks for none. Raises RequestError when invalid."""
    return _read(pod, rules)[0]


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
            if value > MOST:
                errors.append(
                    problem(where=_where(container), resource=resource, value=raw,
                            what="is larger than any node has", fix="ask for what one node can give")
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


# --- the pod ----------------------------------------------------------------------------


def _read(pod: Mapping[str, Any] | Any, rules: TranslationRules | None) -> tuple[DeviceRequest | None, list[ContainerRequest]]:
    """The pod's request and its containers' parts; raises RequestError with every problem found."""
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
        return None, []
    sources = sorted({p.source for p in parts})
    if len(sources) > 1:
        styles = ", ".join(f"{p.where} asks as {p.source} ({_first_term(p)})" for p in parts)
        raise RequestError(
            [f"{styles}: containers of one pod must ask for GPUs in one style; write them all in the same resources"]
        )
    if len(parts) == 1:
        (only,) = parts
        request = derive_request(amounts=only.amounts, terms=only.terms, where=only.where, source=only.source,
                                 errors=errors, memory_hint=only.memory_hint)
    else:
        # Koordinator validates the pod's summed request only (utils.go, GetPodDeviceRequests).
        total = effective_requests((p.kind, p.amounts) for p in parts)
        terms = {key: _total_term(key, value, parts) for key, value in total.items()}
        where = "containers " + ", ".join(f'"{p.name}"' for p in parts) + " together"
        request = derive_request(amounts=total, terms=terms, where=where, source=sources[0], errors=errors,
                                 memory_hint=parts[0].memory_hint)
    if request is None:
        if errors:
            raise RequestError(errors)
        return None, []
    # The burstable tier rides on annotations (apis/overcommit.py says why).
    request = overcommit.burst_of(_annotations(pod), request, gpu_containers=len(parts), errors=errors)
    if errors:
        raise RequestError(errors)
    if len(parts) == 1:
        return request, [ContainerRequest(name=parts[0].name, kind=parts[0].kind, request=request)]
    return request, _parts_of(parts, request)


def _parts_of(parts: Sequence[_Part], pod_request: DeviceRequest) -> list[ContainerRequest]:
    """Each container's own request if all are valid alone and lay out together, else each spread over all cards.

    Raises RequestError when even the spread parts cannot share the cards (the split's own
    rules, e.g. a memory-only container beside containers with compute), so that the pod is
    refused when it is read rather than when it is bound.
    """
    own: list[ContainerRequest] = []
    for part in parts:
        alone = derive_request(amounts=part.amounts, terms=part.terms, where=part.where, source=part.source, errors=[])
        if alone is None:
            break
        own.append(ContainerRequest(name=part.name, kind=part.kind, request=alone))
    else:
        if _split_problem(own, pod_request) is None:
            return own
    errors: list[str] = []
    spread = []
    for part in parts:
        request = spread_request(amounts=part.amounts, terms=part.terms, where=part.where, source=part.source,
                                 gpus=pod_request.gpus, errors=errors, memory_hint=part.memory_hint)
        if request is not None:
            spread.append(ContainerRequest(name=part.name, kind=part.kind, request=request))
    if errors:
        raise RequestError(errors)
    unsplittable = _split_problem(spread, pod_request)
    if unsplittable is not None:
        raise RequestError([unsplittable])
    return spread


def _split_problem(containers: Sequence[ContainerRequest], pod_request: DeviceRequest) -> str | None:
    """Why apis.container_split cannot lay `containers` over an allocation of `pod_request`; None when it can.

    The split itself decides, over cards shaped like the request: memory in
    percent units for a ratio (a real card's bytes round the same way or
    better), or the request's bytes.
    """
    size = pod_request.memory_bytes or 100
    memory = size if pod_request.whole else pod_request.memory_bytes_on(size)
    ratio = pod_request.memory_ratio_percent or 100
    cards = tuple(
        GPUShare(minor=i, uuid=f"card-{i}", core_percent=pod_request.core_percent, memory_bytes=memory,
                 memory_ratio_percent=ratio)
        for i in range(pod_request.gpus)
    )
    try:
        split_allocation(Allocation(gpus=cards), containers, gpu_memory={c.uuid: size for c in cards})
    except SplitError as exc:
        return str(exc)
    return None


# --- one container --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    """A container that asks for GPUs, in Koordinator amounts (not yet checked: the pod's sum is)."""

    name: str
    where: str
    kind: ContainerKind
    source: str
    amounts: Mapping[str, int]
    terms: Mapping[str, Term]
    #: How to add memory in the resources the container used (for "core alone" messages).
    memory_hint: str


def _containers(pod: Mapping[str, Any] | Any) -> list[ContainerResources]:
    try:
        return container_resources(pod)
    except PodShapeError as exc:
        raise RequestError([f"{exc}; write the pod as Kubernetes does (see examples/pods/)"]) from exc


def _annotations(pod: Mapping[str, Any] | Any) -> Mapping[str, str]:
    meta = as_pod_dict(pod).get("metadata")
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(found, Mapping):
        return {}
    return {str(k): str(v) for k, v in found.items() if v is not None}


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
    values, raw, zeros = _values(container, [*koord, *vendor], errors)
    # A zero is no request (Koordinator: quotav1.RemoveZeros in GetPodDeviceRequests).
    koord = [r for r in koord if r not in zeros]
    vendor = [r for r in vendor if r not in zeros]
    if not koord and not vendor and len(errors) == first_errors:
        return None
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
    return _Part(container.name, where, container.kind, source, amounts, terms, memory_hint)


def _values(
    container: ContainerResources, resources: Sequence[str], errors: list[str]
) -> tuple[dict[str, int], dict[str, str], set[str]]:
    """Whole values of the resources (limits if given, as Kubernetes defaults requests), and those that are zero.

    A zero is left out of the values: Kubernetes and Koordinator read it as no request.
    """
    where = _where(container)
    values: dict[str, int] = {}
    raw_text: dict[str, str] = {}
    zeros: set[str] = set()
    for resource in resources:
        request, limit = container.requests.get(resource), container.limits.get(resource)
        raw = limit if limit is not None else request
        raw_text[resource] = str(raw)
        parsed = _whole(resource, raw, where, errors)
        if parsed is None:
            continue
        if request is not None and limit is not None:
            other = _whole(resource, request, where, errors)
            if other is None:
                continue
            if other != parsed:
                errors.append(
                    problem(where=where, resource=resource, value=f"{request} (requests) vs {limit} (limits)",
                            what="limits must equal requests for an extended resource",
                            fix=f"set both to the same value, or give only limits: {limit}")
                )
                continue
        if parsed == 0:
            zeros.add(resource)
        else:
            values[resource] = parsed
    return values, raw_text, zeros


#: The largest amount of any resource read from a pod (1 PiB of memory, 2^50 GPUs or cores): beyond
#: what any node has, and small enough that the scheduler's 64-bit sums of requests never overflow.
MOST = 2**50

_HUGE_EXPONENT = re.compile(r"[eE][+-]?\d{3,}")


def _quantity(raw: object, resource: str) -> Fraction:
    """parse_quantity, refusing exponents that would take ages to expand ("1e999999999")."""
    if isinstance(raw, str) and _HUGE_EXPONENT.search(raw):
        raise ValueError(f"{resource}: {raw!r} has an exponent too large for any resource")
    if isinstance(raw, float) and not math.isfinite(raw):
        raise ValueError(f"{resource}: {raw!r} is not a finite number")
    return parse_quantity(raw, field=resource)


def _whole(resource: str, raw: object, where: str, errors: list[str]) -> int | None:
    example = "20Gi" if resource == names.GPU_MEMORY else "50"
    try:
        value = _quantity(raw, resource)
    except ValueError:
        errors.append(problem(where=where, resource=resource, value=raw, what="is not a number",
                              fix=f"write a whole number such as {example}"))
        return None
    if value < 0:
        errors.append(problem(where=where, resource=resource, value=raw, what="is negative",
                              fix=f"ask for 1 or more, or for 0 (or remove {resource}) to ask for none"))
        return None
    if value > MOST:
        errors.append(problem(where=where, resource=resource, value=raw, what="is larger than any node has",
                              fix="ask for what one node can give"))
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
