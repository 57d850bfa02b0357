"""The checks every GPU request passes in Koordinator's terms, and how it splits over its cards.

Whatever resources a container asked in, its request reaches here as
Koordinator amounts (`koordinator.sh/gpu-core`, `gpu-memory`,
`gpu-memory-ratio`, `gpu.shared`, `koordinator.sh/gpu`) with the terms the pod
wrote them in, so each failure names the resource and value the pod used.

The checks are Koordinator's (`pkg/scheduler/plugins/deviceshare/utils.go`,
`ValidateDeviceRequest`; `devicehandler_gpu.go`, `calcDesiredRequestsAndCountForGPU`),
applied to the pod's summed request as Koordinator applies them. Where fgpu
differs on purpose, docs/translation-rules.md ("Differences from Koordinator")
says why, and tests/apis_request/test_koordinator_compat.py holds each case.
"""

from __future__ import annotations

from collections.abc import Mapping

from apis import names
from apis.device_request import DeviceRequest
from apis.quantity import format_bytes
from apis.translation_rule import Term, problem

_PERCENTS = (names.GPU_CORE, names.GPU_MEMORY_RATIO)


def derive_request(
    *,
    amounts: Mapping[str, int],
    terms: Mapping[str, Term],
    where: str,
    source: str,
    errors: list[str],
    memory_hint: str = "",
) -> DeviceRequest | None:
    """Checks a request in Koordinator's terms and splits it over its cards (None: it asks for no GPU, or is invalid)."""
    start = len(errors)

    def fail(resource: str, what: str, fix: str) -> None:
        term = terms.get(resource, Term(resource, str(amounts.get(resource))))
        message = problem(where=where, resource=term.resource, value=term.text, what=what, fix=fix)
        # koordinator.sh/gpu stands for both core and ratio: one problem with it is told once.
        if message not in errors[start:]:
            errors.append(message)

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
    # Every problem is listed, the values' own first, so that a fix suggested for one is not refused by another.
    if shared is not None:
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
        for resource in _PERCENTS:
            value = amounts.get(resource)
            if value is not None and value > 100 and value % 100:
                fail(resource, "is above 100 but not a multiple of 100: a percentage above 100 must be a multiple of 100 "
                     "(a share of one card, or whole cards)",
                     f"ask for {value // 100 * 100} or {(value // 100 + 1) * 100}, or for at most 100")
    if memory is not None and ratio is not None:
        ratio_text = terms[names.GPU_MEMORY_RATIO].text if names.GPU_MEMORY_RATIO in terms else ratio
        fail(names.GPU_MEMORY, f"is given together with {shown(names.GPU_MEMORY_RATIO)}={ratio_text}: "
             "memory and memory-ratio together are invalid",
             f"keep only one of {shown(names.GPU_MEMORY)} and {shown(names.GPU_MEMORY_RATIO)}")
    if core is not None and memory is None and ratio is None:
        if not memory_hint:
            memory_hint = (f"{names.GPU_MEMORY_RATIO} (e.g. {_valid_percent_near(core, shared)}) "
                           f"or {names.GPU_MEMORY} (e.g. 10Gi)")
        fail(names.GPU_CORE, "asks for compute without memory: core alone is invalid", f"add {memory_hint}")
    if len(errors) > start:
        return None
    gpus = shared if shared is not None else _cards(core, ratio)
    if shared is None and core is not None and ratio is not None and core > 100 * gpus:
        fail(names.GPU_CORE, f"is more than 100 per card: {shown(names.GPU_MEMORY_RATIO)}="
             f"{terms[names.GPU_MEMORY_RATIO].text if names.GPU_MEMORY_RATIO in terms else ratio} spans {gpus} card(s), "
             f"and without {names.GPU_SHARED} the memory ratio sets the number of cards",
             f"ask for at most {100 * gpus}, or give {shown(names.GPU_MEMORY_RATIO)} {core // 100 * 100} "
             f"for {core // 100} cards, or spread a share with {names.GPU_SHARED}")
    if len(errors) > start:
        return None
    # Each card gets an equal part; a remainder is dropped, as Koordinator divides
    # (calcDesiredRequestsAndCountForGPU), so the pod never gets more than it asked for.
    if memory is not None and memory < gpus:
        fail(names.GPU_MEMORY, f"is less than one byte for each of {gpus} cards",
             f"ask for at least {gpus} bytes, e.g. {format_bytes(gpus * 2**30)}")
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


def spread_request(
    *,
    amounts: Mapping[str, int],
    terms: Mapping[str, Term],
    where: str,
    source: str,
    gpus: int,
    errors: list[str],
    memory_hint: str = "",
) -> DeviceRequest | None:
    """One container's own amounts spread evenly over all `gpus` cards of its pod.

    For a pod whose containers' own requests cannot each stand alone (Koordinator
    checks only their sum) or do not lay out together on the pod's cards: every
    GPU container then sees all of the pod's cards, with its part of each. Parts
    are rounded down, so together they never exceed the pod's share of a card.
    A container needs memory of its own: fgpu limits each container to its part.
    """
    start = len(errors)
    whole = amounts.get(names.KOORD_GPU)
    core = amounts.get(names.GPU_CORE, whole)
    ratio = amounts.get(names.GPU_MEMORY_RATIO, whole)
    memory = amounts.get(names.GPU_MEMORY)

    def fail(resource: str, what: str, fix: str) -> None:
        term = terms.get(resource, Term(resource, str(amounts.get(resource))))
        errors.append(problem(where=where, resource=term.resource, value=term.text, what=what, fix=fix))

    if memory is None and ratio is None:
        resource = names.GPU_CORE if core else next(iter(amounts), names.GPU_SHARED)
        fail(resource, "gives this container compute or cards but no GPU memory of its own; Koordinator lets another "
             "container's memory complete the pod's request, but fgpu limits each container to its own part "
             "of the pod's GPUs, so this container would get no GPU memory",
             f"add {memory_hint or f'{names.GPU_MEMORY_RATIO} or {names.GPU_MEMORY}'} to this container, "
             "or remove its GPU resources")
    elif (memory if memory is not None else ratio or 0) < gpus:
        resource = names.GPU_MEMORY if memory is not None else names.GPU_MEMORY_RATIO
        fail(resource, f"is too small to give this container a part of each of the pod's {gpus} cards",
             f"ask for at least {gpus}")
    if len(errors) > start:
        return None
    core_each = min((core or 0) // gpus, 100)
    ratio_each = min(ratio // gpus, 100) if ratio is not None else None
    return DeviceRequest(
        gpus=gpus,
        core_percent=core_each,
        memory_bytes=memory // gpus if memory is not None else None,
        memory_ratio_percent=ratio_each,
        whole=core_each == 100 and ratio_each == 100,
        source=source,
    )


def _cards(core: int | None, ratio: int | None) -> int:
    """The number of cards of a request without gpu.shared.

    Koordinator (devicehandler_gpu.go, calcDesiredRequestsAndCountForGPU) counts
    them from gpu-memory-ratio alone: ratio / 100 above 100, else one card. With
    memory in bytes it always counts one card, so `gpu-core: 300` asks for 300%
    of a single card, which no card has; fgpu reads it as three cards instead
    (docs/translation-rules.md, "Differences from Koordinator").
    """
    if ratio is not None:
        return ratio // 100 if ratio > 100 else 1
    return core // 100 if core is not None and core > 100 else 1


def _valid_percent_near(value: int, shared: int | None) -> int:
    """A percentage near `value` that passes the checks above, for examples in fixes.

    Without gpu.shared: `value` up to 100 or a multiple of 100, else the multiple of 100 below.
    With it: at most 100 per card and a multiple of gpu.shared.
    """
    if shared is None:
        return value if value <= 100 or value % 100 == 0 else value // 100 * 100
    capped = min(value, 100 * shared)
    return max(capped - capped % shared, shared)


def _multiples_near(value: int, step: int) -> str:
    below = value - value % step
    return f"{below} or {below + step}" if below else str(step)
