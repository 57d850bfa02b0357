"""The pod as the API has it, for the calls that choose and sign GPUs.

A caller of Reserve/Bind (gRPC) or bind (extender) names a pod; with the
kubernetes backend the scheduler then reads that pod from the API and decides
on what it finds there, never on a pod object the caller sent. Otherwise a
caller could send a pod that asks for a whole GPU under the name and UID of a
pod that asks for 1%, and the real pod would be annotated with a signed
allocation it never requested.
"""

from __future__ import annotations

from typing import Any

from scheduler_plugin import pods
from scheduler_plugin.errors import InvalidRequest, NotFound
from scheduler_plugin.scheduling import SchedulingService

JSON = dict[str, Any]


def from_api(service: SchedulingService, *, namespace: str, name: str, uid: str) -> JSON:
    """The pod `namespace/name` as the API has it; `uid`, when given, must be its UID (not a namesake)."""
    if not name:
        raise InvalidRequest("pod name: required; name the pod to reserve or bind (metadata.name)")
    pod = service.get_pod(namespace=namespace or "default", name=name)
    if pod is None:
        raise NotFound(f"pod {namespace or 'default'}/{name} not found; it may have been deleted")
    if uid and pods.uid(pod) != uid:
        raise NotFound(f"pod {namespace or 'default'}/{name} has uid {pods.uid(pod)}, not {uid}: it was recreated")
    return pod
