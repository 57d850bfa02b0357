"""Reading a Pod that arrives either as an API dict or as the kubernetes client's V1Pod.

The scheduler's informer hands out V1Pod models, `fgpuctl` and the runtime
proxy see plain dicts (camelCase, as the API server returns them). Everything
here turns both into the dict form once, so the parsers above read one shape.
The client models are converted through their own `attribute_map`, so this
module never imports the `kubernetes` package.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

#: restartPolicy of an init container that keeps running beside the app (a sidecar, KEP-753).
_SIDECAR_RESTART_POLICY = "Always"


def as_pod_dict(pod: Mapping[str, Any] | Any) -> Mapping[str, Any]:
    """The pod as an API dict; a client model (V1Pod) is converted, a mapping is returned as is."""
    if isinstance(pod, Mapping):
        return pod
    converted = _model_to_dict(pod)
    if not isinstance(converted, Mapping):
        raise TypeError(f"expected a Pod as a dict or a kubernetes V1Pod, got {type(pod).__name__}")
    return converted


def _model_to_dict(value: Any) -> Any:
    # Client models (V1Pod, V1Container, ...) list their fields in `openapi_types`
    # and the wire (camelCase) name of each in `attribute_map`.
    attribute_map = getattr(value, "attribute_map", None)
    if isinstance(attribute_map, Mapping) and hasattr(value, "openapi_types"):
        out: dict[str, Any] = {}
        for attr, wire_name in attribute_map.items():
            item = getattr(value, attr, None)
            if item is not None:
                out[wire_name] = _model_to_dict(item)
        return out
    if isinstance(value, Mapping):
        return {key: _model_to_dict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_model_to_dict(item) for item in value]
    return value


def pod_key(pod: Mapping[str, Any] | Any) -> str:
    """"<namespace>/<name>" ("default" when the manifest names no namespace)."""
    meta = _mapping(as_pod_dict(pod).get("metadata"))
    namespace = meta.get("namespace") or "default"
    name = meta.get("name") or meta.get("generateName") or ""
    return f"{namespace}/{name}"


class ContainerKind(enum.Enum):
    APP = enum.auto()
    INIT = enum.auto()
    #: An init container with restartPolicy Always: it runs for the pod's lifetime.
    SIDECAR = enum.auto()


@dataclass(frozen=True)
class ContainerResources:
    """One container's name and its raw `resources` (values as written: "50", 2, "20Gi")."""

    name: str
    kind: ContainerKind
    requests: Mapping[str, object]
    limits: Mapping[str, object]


class PodShapeError(ValueError):
    """A pod whose spec is not shaped like a Pod's (containers not a list, limits not a mapping, ...)."""


def container_resources(pod: Mapping[str, Any] | Any) -> list[ContainerResources]:
    """Init containers (in order) then app containers, with their requests and limits."""
    spec = _mapping(as_pod_dict(pod).get("spec"))
    out: list[ContainerResources] = []
    for field, is_init in (("initContainers", True), ("containers", False)):
        listed = spec.get(field) or []
        if not isinstance(listed, list):
            raise PodShapeError(f"spec.{field}: expected a list of containers, got {type(listed).__name__}")
        for index, raw in enumerate(listed):
            where = f"spec.{field}[{index}]"
            if not isinstance(raw, Mapping):
                raise PodShapeError(f"{where}: expected a container (a mapping), got {type(raw).__name__}")
            container = raw
            resources = _shaped(container.get("resources"), f"{where}.resources")
            if not is_init:
                kind = ContainerKind.APP
            elif container.get("restartPolicy") == _SIDECAR_RESTART_POLICY:
                kind = ContainerKind.SIDECAR
            else:
                kind = ContainerKind.INIT
            out.append(
                ContainerResources(
                    name=str(container.get("name") or f"{field}[{index}]"),
                    kind=kind,
                    requests=_shaped(resources.get("requests"), f"{where}.resources.requests"),
                    limits=_shaped(resources.get("limits"), f"{where}.resources.limits"),
                )
            )
    return out


def pod_overhead(pod: Mapping[str, Any] | Any) -> Mapping[str, object]:
    """spec.overhead (RuntimeClass overhead), which Kubernetes adds to the pod's requests."""
    return _mapping(_mapping(as_pod_dict(pod).get("spec")).get("overhead"))


#: An amount: whole units (int) or an exact quantity (Fraction).
N = TypeVar("N", int, Fraction)


def effective_requests(
    containers: Iterable[tuple[ContainerKind, Mapping[str, N]]],
) -> dict[str, N]:
    """Kubernetes' effective pod request, per resource (resourcehelper.PodRequests).

    App containers and sidecars add up; a plain init container runs alone beside
    the sidecars started before it, so the pod needs the larger of the two.
    `containers` come init containers first, in spec order.
    """
    app: dict[str, N] = {}
    sidecars: dict[str, N] = {}
    init_peak: dict[str, N] = {}
    for kind, amounts in containers:
        if kind is ContainerKind.APP:
            _accumulate(app, amounts)
            continue
        if kind is ContainerKind.SIDECAR:
            _accumulate(app, amounts)
            _accumulate(sidecars, amounts)
            running: Mapping[str, N] = sidecars
        else:
            alongside: dict[str, N] = dict(sidecars)
            _accumulate(alongside, amounts)
            running = alongside
        for name, value in running.items():
            if name not in init_peak or value > init_peak[name]:
                init_peak[name] = value
    for name, value in init_peak.items():
        if name not in app or value > app[name]:
            app[name] = value
    return app


def _accumulate(total: dict[str, N], amounts: Mapping[str, N]) -> None:
    for name, value in amounts.items():
        total[name] = total[name] + value if name in total else value


def _shaped(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodShapeError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
