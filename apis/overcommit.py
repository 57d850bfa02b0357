"""Burstable GPU shares: how a pod asks for one, the rule it must follow, and its value.

Two tiers share a GPU. A *guaranteed* share (every share without the annotation) is today's: its
request is reserved and it never runs on borrowed capacity. A *burstable* share reserves its
request too, but may use up to a larger limit while the guaranteed shares beside it leave that
capacity idle; the node takes it back by evicting burstable pods (docs/overcommit.md).

Why annotations and not request < limit on the resources themselves: the API server refuses a
pod whose request and limit differ on any extended resource (`koordinator.sh/gpu-*` are extended
resources: pkg/apis/core/validation, ValidateResourceRequirements, "must be equal to ... limit";
only native resources such as cpu and memory may be overcommitted). Koordinator's device protocol
has no GPU overcommit either, and its readers skip annotations they do not know. So the pod keeps
asking its *request* in Koordinator's resources (limits = requests, as Kubernetes demands) and
says the tier and the limits beside it::

    metadata:
      annotations:
        fgpu.io/gpu-qos: burstable
        fgpu.io/gpu-core-limit: "80"          # percent of the card, >= the gpu-core request
        fgpu.io/gpu-memory-limit: 20Gi        # beside a gpu-memory request (bytes) ...
        # fgpu.io/gpu-memory-ratio-limit: "60"  # ... or beside a gpu-memory-ratio request
    spec:
      containers:
      - resources:
          limits: {koordinator.sh/gpu-core: "30", koordinator.sh/gpu-memory: 8Gi}

The rule (`burst_of` checks it; `fgpuctl validate`, the webhook and the scheduler all read the pod
through `apis.request.parse_pod`, which calls it):

* `fgpu.io/gpu-qos` is `guaranteed` (the default) or `burstable`;
* the limit annotations appear only with `burstable`, and a burstable pod gives at least one, above
  its request; a missing one is the request (no burst in that dimension);
* burstable is a share of one GPU (not whole GPUs, not several cards), served by one container,
  and never a MIG instance (`fgpu.io/gpu-mode: mig`): MIG partitions are hard, nothing to borrow;
* each limit is at least the request, the core limit at most 100, the memory limit written in the
  request's own kind (bytes beside `gpu-memory`, percent beside `gpu-memory-ratio`), a memory
  limit in bytes at most 1 PiB (`MAX_MEMORY_LIMIT_BYTES`; the scheduler clamps it to the card).

The pod's annotations are the author's and may change after scheduling; the node therefore
enforces the limit the scheduler signed into the allocation (`names.ALLOCATION_BURST_LIMIT`),
never the annotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction

from apis import names
from apis.device_request import Burst, DeviceRequest
from apis.quantity import QuantityError, format_bytes, parse_quantity
from apis.quoting import quoted

#: Every annotation this module reads (for memoizing checks by what they read).
ANNOTATIONS = (names.GPU_QOS, names.GPU_CORE_LIMIT, names.GPU_MEMORY_LIMIT, names.GPU_MEMORY_RATIO_LIMIT)
_LIMITS = (names.GPU_CORE_LIMIT, names.GPU_MEMORY_LIMIT, names.GPU_MEMORY_RATIO_LIMIT)
_FULL = 100
#: No GPU comes near a pebibyte (the largest hold a few hundred GiB). A limit above it is a typo or an
#: attack: the scheduler sums limits per GPU, and sums of values near 2**62 leave 64-bit integers.
MAX_MEMORY_LIMIT_BYTES = 2**50


def tier(request: DeviceRequest | None) -> str:
    """The request's tier: `burstable` or `guaranteed`."""
    return names.GPU_QOS_BURSTABLE if request is not None and request.limit is not None else names.GPU_QOS_GUARANTEED


def burst_of(
    annotations: Mapping[str, str], request: DeviceRequest, *, gpu_containers: int, errors: list[str]
) -> DeviceRequest:
    """`request` as the pod's annotations make it: with its `limit` (burstable), or unchanged.

    Appends one message per problem to `errors` (each naming the annotation, its value and the
    fix) and then returns `request` unchanged. `gpu_containers`: how many containers ask for GPUs.
    """
    qos = annotations.get(names.GPU_QOS, "").strip()
    given = {key: annotations[key].strip() for key in _LIMITS if key in annotations}
    if qos not in ("", names.GPU_QOS_GUARANTEED, names.GPU_QOS_BURSTABLE):
        errors.append(
            f"annotation {names.GPU_QOS}: {quoted(qos)} is not a GPU QoS tier; write {names.GPU_QOS_BURSTABLE} "
            f"(borrow idle GPU capacity up to a limit, evictable) or {names.GPU_QOS_GUARANTEED} (the default)"
        )
        return request
    if qos != names.GPU_QOS_BURSTABLE:
        if given:
            errors.append(
                f"annotation {next(iter(given))}: {quoted(next(iter(given.values())))} is a burstable limit, but the pod "
                f"is not burstable; add {names.GPU_QOS}: {names.GPU_QOS_BURSTABLE}, or remove the limit annotations"
            )
        return request
    start = len(errors)
    if request.whole or request.gpus != 1:
        what = "whole GPUs" if request.whole else f"a share of {request.gpus} cards"
        errors.append(
            f"annotation {names.GPU_QOS}: {names.GPU_QOS_BURSTABLE} needs a share of one GPU, but the pod asks for "
            f"{what}; ask for one card's share (e.g. {names.GPU_CORE}: 30 and {names.GPU_MEMORY}: 8Gi), or remove "
            "the annotation"
        )
    if gpu_containers > 1:
        errors.append(
            f"annotation {names.GPU_QOS}: {names.GPU_QOS_BURSTABLE} needs one container that asks for the GPU, "
            f"but {gpu_containers} do; give the GPU resources to one container only"
        )
    mode = annotations.get(names.GPU_MODE, "").strip().lower()
    if mode == "mig":
        errors.append(
            f"annotation {names.GPU_QOS}: {names.GPU_QOS_BURSTABLE} with {names.GPU_MODE}: mig: a MIG instance is a "
            "hard partition with nothing to borrow; drop one of the two"
        )
    core = _core_limit(given, request, errors)
    memory_bytes, memory_ratio = _memory_limit(given, request, errors)
    if len(errors) > start:
        return request
    if not given:
        errors.append(
            f"annotation {names.GPU_QOS}: {names.GPU_QOS_BURSTABLE} without a limit; add {names.GPU_CORE_LIMIT} "
            f"and/or {names.GPU_MEMORY_LIMIT} (or {names.GPU_MEMORY_RATIO_LIMIT}) above the request"
        )
        return request
    return replace(request, limit=Burst(core_percent=core, memory_bytes=memory_bytes, memory_ratio_percent=memory_ratio))


def _core_limit(given: Mapping[str, str], request: DeviceRequest, errors: list[str]) -> int:
    raw = given.get(names.GPU_CORE_LIMIT)
    if raw is None:
        return request.core_percent
    value = _number(names.GPU_CORE_LIMIT, raw, example="80", errors=errors)
    if value is None:
        return request.core_percent
    if not request.core_percent <= value <= _FULL:
        errors.append(
            f"annotation {names.GPU_CORE_LIMIT}: {quoted(raw)} must be between the request ({names.GPU_CORE} "
            f"{request.core_percent}) and {_FULL} (one whole card); write e.g. {max(request.core_percent, 80)}"
        )
    return value


def _memory_limit(given: Mapping[str, str], request: DeviceRequest, errors: list[str]) -> tuple[int | None, int | None]:
    bytes_raw, ratio_raw = given.get(names.GPU_MEMORY_LIMIT), given.get(names.GPU_MEMORY_RATIO_LIMIT)
    if request.memory_bytes is not None:
        if ratio_raw is not None:
            errors.append(
                f"annotation {names.GPU_MEMORY_RATIO_LIMIT}: {quoted(ratio_raw)} beside a {names.GPU_MEMORY} request "
                f"(bytes); write the limit in bytes as {names.GPU_MEMORY_LIMIT}, e.g. "
                f"{format_bytes(request.memory_bytes * 2)}"
            )
        if bytes_raw is None:
            return request.memory_bytes, None
        value = _number(names.GPU_MEMORY_LIMIT, bytes_raw, example="20Gi", errors=errors)
        if value is not None and value > MAX_MEMORY_LIMIT_BYTES:
            errors.append(
                f"annotation {names.GPU_MEMORY_LIMIT}: {quoted(bytes_raw)} is more memory than any GPU has (at most "
                f"{format_bytes(MAX_MEMORY_LIMIT_BYTES)} is accepted); write the most the pod may use on one card, "
                f"e.g. 20Gi (a limit above the card is the whole card)"
            )
            value = None
        elif value is not None and value < request.memory_bytes:
            errors.append(
                f"annotation {names.GPU_MEMORY_LIMIT}: {quoted(bytes_raw)} is below the request ({names.GPU_MEMORY} "
                f"{format_bytes(request.memory_bytes)}); write at least that much"
            )
        return (value if value is not None else request.memory_bytes), None
    ratio = request.memory_ratio_percent or 0
    if bytes_raw is not None:
        errors.append(
            f"annotation {names.GPU_MEMORY_LIMIT}: {quoted(bytes_raw)} beside a {names.GPU_MEMORY_RATIO} request "
            f"(percent of the card); write the limit in percent as {names.GPU_MEMORY_RATIO_LIMIT}, e.g. {min(_FULL, ratio * 2)}"
        )
    if ratio_raw is None:
        return None, ratio
    value = _number(names.GPU_MEMORY_RATIO_LIMIT, ratio_raw, example="60", errors=errors)
    if value is not None and not ratio <= value <= _FULL:
        errors.append(
            f"annotation {names.GPU_MEMORY_RATIO_LIMIT}: {quoted(ratio_raw)} must be between the request "
            f"({names.GPU_MEMORY_RATIO} {ratio}) and {_FULL}; write e.g. {min(_FULL, ratio * 2)}"
        )
    return None, (value if value is not None else ratio)


def _number(key: str, raw: str, *, example: str, errors: list[str]) -> int | None:
    try:
        value = parse_quantity(raw, field=key) if len(raw) < 64 else None
    except (QuantityError, ValueError):
        value = None
    if value is None or value < 0 or value.denominator != 1 or value > Fraction(2**62):
        errors.append(f"annotation {key}: {quoted(raw)} is not a whole non-negative number; write e.g. {example}")
        return None
    return int(value)


#: `Burst` lives beside `DeviceRequest` (its `limit`) and is re-exported for readers of this module.
__all__ = ["ANNOTATIONS", "MAX_MEMORY_LIMIT_BYTES", "Burst", "burst_of", "tier"]
