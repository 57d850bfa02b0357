"""A pod's resources checked: the verdict `fgpuctl validate` prints and the admission webhook enforces.

`check_pod` is the one decision both call. It reads the pod the way the
scheduler does (`apis.request.parse_pod` for the GPU request,
`apis.mig.pod_mig_mode` for its `fgpu.io/gpu-mode` annotation,
`apis.pod_annotations.read_placement` for its model, topology and job-key
annotations, `apis.request.pod_cpu_memory` for CPU and memory), so a pod the webhook
refuses is refused by the scheduler too, with the same lines, each naming the
container, the resource, the value and the fix::

    PodCheck(request=None, errors=('container "main": koordinator.sh/gpu-core=150: ...',))

`gpu_resources` answers the question before it: does the pod ask for GPUs at
all (Koordinator's resources, or any resource a translation rule maps)?

`resources_fingerprint` is the part of a pod `check_pod` reads. Pods created
together (a Deployment's or Job's replicas) share it, so a caller may memoize
the check by it: equal fingerprints and the same rules give equal checks.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from apis import names, overcommit
from apis.device_request import DeviceRequest, RequestError
from apis.mig import MIGRequestError, pod_mig_mode
from apis.pod_annotations import ANNOTATIONS as PLACEMENT_ANNOTATIONS
from apis.pod_annotations import read_placement
from apis.pods import ContainerKind, PodShapeError, as_pod_dict, container_resources
from apis.quantity import parse_quantity
from apis.request import parse_pod, pod_cpu_memory
from apis.translation import TranslationRules, problem


@dataclass(frozen=True)
class PodCheck:
    """The verdict on one pod: its GPU request (None: it asks for none), or every problem found."""

    request: DeviceRequest | None
    #: One line per problem; empty when the pod is valid.
    errors: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def message(self) -> str:
        """The problems on one line, as `RequestError` and the scheduler join them."""
        return "; ".join(self.errors)


def check_pod(pod: Mapping[str, Any] | Any, *, rules: TranslationRules) -> PodCheck:
    """The pod's GPU request, or every problem with its GPU, CPU and memory requests."""
    errors: list[str] = []
    request = None
    request_ok = True
    try:
        request = parse_pod(pod, rules=rules)
    except RequestError as exc:
        errors.extend(exc.errors)
        request_ok = False
    errors.extend(_requests_without_limits(pod, rules))
    try:
        # The scheduler reads the same annotation with the same call (core/podrequest.py).
        cards = (request.gpus if request else 0) if request_ok else None
        pod_mig_mode(_annotations(pod), cards=cards, whole=bool(request and request.whole))
    except MIGRequestError as exc:
        errors.append(str(exc))
    try:
        read_placement(_annotations(pod))  # the scheduler's reading too, so it would refuse the same
    except RequestError as exc:
        errors.extend(exc.errors)
    try:
        pod_cpu_memory(pod)
    except RequestError as exc:
        errors.extend(exc.errors)
    if errors:
        return PodCheck(request=None, errors=tuple(errors))
    return PodCheck(request=request)


def gpu_resources(pod: Mapping[str, Any] | Any, *, rules: TranslationRules) -> tuple[str, ...]:
    """The GPU resources any container asks for (sorted): Koordinator's, or one a rule maps.

    A resource written as zero is no request (as `parse_pod` reads it); a value
    that is not a quantity counts, since the pod meant to ask for something.
    A pod not shaped like a Pod asks for none.
    """
    known = (*names.KOORDINATOR_RESOURCES, *sorted(rules.resources))
    try:
        containers = container_resources(pod)
    except PodShapeError:
        return ()
    found: set[str] = set()
    for container in containers:
        for resource in known:
            values = [v for v in (container.requests.get(resource), container.limits.get(resource)) if v is not None]
            if values and not all(_is_zero(v) for v in values):
                found.add(resource)
    return tuple(sorted(found))


def resources_fingerprint(pod: Mapping[str, Any] | Any) -> Hashable | None:
    """What `check_pod` reads of the pod, hashable; None when the pod is not shaped for one.

    That is each container's (init containers first) name, restartPolicy and
    resources, spec.overhead, the `fgpu.io/gpu-mode` annotation, the burstable ones and the
    placement ones (`apis.pod_annotations.ANNOTATIONS`). Scalars keep their type (`50` and `"50"`
    differ) and mappings their order, so equal fingerprints read alike.
    """
    spec = as_pod_dict(pod).get("spec")
    if not isinstance(spec, Mapping):
        return None
    parts: list[Hashable] = []
    for field in ("initContainers", "containers"):
        listed = spec.get(field)
        if listed is None:
            parts.append(None)
            continue
        if not isinstance(listed, list):
            return None
        for container in listed:
            if not isinstance(container, Mapping):
                return None
            parts.append((field, _frozen(container.get("name")), _frozen(container.get("restartPolicy")),
                          _frozen(container.get("resources"))))
    parts.append(_frozen(spec.get("overhead")))
    annotations = _annotations(pod)
    parts.append(_frozen(annotations.get(names.GPU_MODE)))
    # The burstable tier and its limits (apis/overcommit.py) are read by parse_pod too.
    parts.extend(_frozen(annotations.get(key)) for key in overcommit.ANNOTATIONS)
    parts.extend(_frozen(annotations.get(key)) for key in PLACEMENT_ANNOTATIONS)
    return tuple(parts)


def _requests_without_limits(pod: Mapping[str, Any] | Any, rules: TranslationRules) -> list[str]:
    """A GPU resource in a container's requests but not its limits, which the API server refuses.

    Kubernetes rejects such a pod ("Limit must be set for non overcommitable
    resources"), zero or not, so it never reaches the scheduler, which reads
    requests alone as limits (`parse_pod`); `fgpuctl validate` and the webhook
    say so before `kubectl apply` does.
    """
    known = (*names.KOORDINATOR_RESOURCES, *sorted(rules.resources))
    try:
        containers = container_resources(pod)
    except PodShapeError:
        return []  # parse_pod says what is wrong with the pod's shape
    errors = []
    for container in containers:
        label = "container" if container.kind is ContainerKind.APP else "init container"
        for resource in known:
            value = container.requests.get(resource)
            if value is not None and container.limits.get(resource) is None:
                errors.append(problem(
                    where=f'{label} "{container.name}"', resource=resource, value=f"{value} (requests)",
                    what="is in requests without limits, which Kubernetes refuses for an extended resource",
                    fix=f"put it in limits: {value} (requests may be left out: they default to the limits)"))
    return errors


def _annotations(pod: Mapping[str, Any] | Any) -> Mapping[str, str]:
    """The pod's annotations; none when metadata is not shaped as a Pod's (the request checks say what is wrong)."""
    meta = as_pod_dict(pod).get("metadata")
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(found, Mapping):
        return {}
    return {str(k): str(v) for k, v in found.items() if v is not None}


def _is_zero(value: object) -> bool:
    try:
        return parse_quantity(value) == 0
    except ValueError:  # QuantityError, or digits past int()'s limit
        return False


def _frozen(value: object) -> Hashable:
    kind = type(value)
    if kind is str or value is None:
        return value
    if isinstance(value, dict | Mapping):  # dict first: an ABC's isinstance is slow
        # In the order written: the same pod reordered is only a memo miss, never a wrong answer.
        return ("map", tuple((_frozen(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("list", tuple(_frozen(v) for v in value))
    return (kind.__name__, repr(value))
