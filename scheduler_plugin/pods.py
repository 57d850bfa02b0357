"""Reading pod objects (dicts in the API's JSON shape) for the service.

Every adapter hands the service a pod as the Kubernetes API writes it: the
extender receives it from kube-scheduler, the standalone loop from a watch,
gRPC callers either send the manifest or the few fields of `fgpu.v1.Pod`
(turned into the same shape by `from_proto`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from apis import names
from apis.request import RequestError
from apis.request import pod_cpu_memory as _pod_cpu_memory
from apis.translation import TranslationRules
from scheduler_plugin.core import noderules
from scheduler_plugin.core.api import PodRequest, PodUID
from scheduler_plugin.core.podrequest import pod_request_from_pod

JSON = dict[str, Any]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    value = pod.get("metadata")
    return value if isinstance(value, Mapping) else {}


def spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    value = pod.get("spec")
    return value if isinstance(value, Mapping) else {}


def uid(pod: Mapping[str, Any]) -> PodUID:
    return PodUID(str(meta(pod).get("uid") or ""))


def key(pod: Mapping[str, Any]) -> str:
    m = meta(pod)
    return f"{m.get('namespace') or 'default'}/{m.get('name') or ''}"


def node_name(pod: Mapping[str, Any]) -> str:
    return str(spec(pod).get("nodeName") or "")


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    value = meta(pod).get("annotations")
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def is_terminated(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status")
    return isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """Assigned to a node and not finished: its resources count as used."""
    return bool(node_name(pod)) and not is_terminated(pod)


def wants_us(pod: Mapping[str, Any]) -> bool:
    """Pending, not being deleted, not held back by scheduling gates, and addressed to fgpu's own
    scheduler name. A gated pod is not ready to be scheduled (kube-scheduler leaves it too, and the
    API server refuses its binding); it comes back through the watch once its gates are removed."""
    return (
        spec(pod).get("schedulerName") == names.SCHEDULER_NAME
        and not node_name(pod)
        and not is_terminated(pod)
        and not meta(pod).get("deletionTimestamp")
        and not spec(pod).get("schedulingGates")
    )


def request_of(pod: Mapping[str, Any], *, rules: TranslationRules | None) -> PodRequest:
    """The core's view of the pod. Raises apis.request.RequestError for an invalid request."""
    return _with_node_needs(pod_request_from_pod(pod, rules=rules), pod)


def _with_node_needs(request: PodRequest, pod: Mapping[str, Any]) -> PodRequest:
    """The request with the pod's tolerations and host ports, which the node rules check
    (a pending pod against each node; a bound one holds its host ports on its node)."""
    needs = noderules.pod_needs(pod)
    device = request.device
    if device is not None and not device.whole:
        needs = dataclasses.replace(needs, needs_limits=True)
    return dataclasses.replace(request, node_needs=needs) if needs != request.node_needs else request


def request_of_bound(pod: Mapping[str, Any], *, rules: TranslationRules | None) -> tuple[PodRequest, str]:
    """Like `request_of`, for a pod that is already bound: never fails.

    A bound pod's resources are used whether or not today's rules accept its
    request (rules may have changed since it was placed), so an invalid
    request still yields a GPU-less PodRequest with its CPU/memory; the
    second value says what was wrong ("" when nothing).
    """
    try:
        return _with_node_needs(pod_request_from_pod(pod, rules=rules), pod), ""
    except RequestError as exc:
        problem = "; ".join(exc.errors) or str(exc)
    except (ValueError, TypeError) as exc:  # a malformed object from the API; count what we can
        problem = str(exc)
    try:
        cpu, mem = _pod_cpu_memory(pod)
    except (ValueError, TypeError):
        cpu, mem = 0, 0
    m = meta(pod)
    request = PodRequest(
        uid=uid(pod),
        namespace=str(m.get("namespace") or "default"),
        name=str(m.get("name") or ""),
        device=None,
        cpu_milli=cpu,
        memory_bytes=mem,
    )
    return _with_node_needs(request, pod), problem


def from_proto_fields(
    *,
    namespace: str,
    name: str,
    uid: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    containers: list[tuple[str, Mapping[str, str], Mapping[str, str], bool]],
) -> JSON:
    """A pod dict from the fields of `fgpu.v1.Pod` (name, requests, limits, init) per container."""
    app: list[JSON] = []
    init: list[JSON] = []
    for cname, requests, limits, is_init in containers:
        resources: JSON = {}
        if requests:
            resources["requests"] = dict(requests)
        if limits:
            resources["limits"] = dict(limits)
        (init if is_init else app).append({"name": cname, "resources": resources})
    pod_spec: JSON = {"containers": app}
    if init:
        pod_spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace or "default",
            "name": name,
            "uid": uid,
            "labels": dict(labels),
            "annotations": dict(annotations),
        },
        "spec": pod_spec,
    }
