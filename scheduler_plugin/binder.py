"""Binding through the Kubernetes API: signed annotations first, then `pods/binding`.

The node agent trusts only what is on the pod when its container is created,
so the allocation must be on the pod before the pod is on the node. Two API
calls cannot be one transaction, so every way the pair can break is handled:

* annotate fails -> nothing bound; a stale annotation on an unbound pod is
  never counted (only assigned pods count) and the next try overwrites it.
* the annotate patch carries the pod's resourceVersion, so it cannot land on
  a pod someone changed (e.g. bound) since we read it; on a conflict we read
  the pod again and retry while it is still unbound.
* binding fails -> we read the pod: bound to our node with our signature
  means the bind did happen (the answer was lost) -> success; unbound -> our
  annotations are removed (rolled back) -> `BindFailed`; bound elsewhere ->
  rolled back -> `Conflict`.
* the outcome cannot be learned (API down) -> `Unavailable`; the caller keeps
  its reservation until the pod shows up bound (counted from its annotation)
  or the reservation expires, so the GPU is neither counted twice nor lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from apis import names
from scheduler_plugin import pods
from scheduler_plugin.errors import BindFailed, Conflict, KubeAPIError, NotFound, Unavailable
from scheduler_plugin.kube import Kube

log = logging.getLogger(__name__)

_ANNOTATION_KEYS = (names.DEVICE_ALLOCATED, names.ALLOCATION_SIGNATURE, names.ALLOCATION_NODE)
_ANNOTATE_ATTEMPTS = 3


def bind(kube: Kube, *, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> None:
    meta = pods.meta(pod)
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    where = f"pod {namespace}/{name}"

    current: Mapping[str, Any] = pod
    for attempt in range(_ANNOTATE_ATTEMPTS):
        bound_to = pods.node_name(current)
        if bound_to:
            if bound_to == node and _carries(current, annotations):
                return  # a retry of a bind that already happened
            raise Conflict(f"{where} is bound to node {bound_to} already; not binding it to {node}")
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if uid:
            metadata["uid"] = uid
        rv = str(pods.meta(current).get("resourceVersion") or "")
        if rv:
            metadata["resourceVersion"] = rv
        try:
            kube.patch_pod_metadata(namespace=namespace, name=name, metadata=metadata)
            break
        except KubeAPIError as exc:
            if exc.status == 404:
                raise NotFound(f"{where} not found; it was deleted") from exc
            if exc.status != 409 or attempt == _ANNOTATE_ATTEMPTS - 1:
                raise
            fresh = kube.get_pod(namespace=namespace, name=name)
            if fresh is None or (uid and pods.uid(fresh) != uid):
                raise NotFound(f"{where} (uid {uid}) is gone or was recreated") from exc
            current = fresh

    try:
        kube.bind_pod(namespace=namespace, name=name, uid=uid, node=node)
        return
    except KubeAPIError as exc:
        failure = exc
    _settle(kube, namespace=namespace, name=name, uid=uid, node=node, annotations=annotations, failure=failure)


def _settle(
    kube: Kube, *, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str], failure: KubeAPIError
) -> None:
    """After a failed binding call: find out what happened, and undo our annotations if it did not bind."""
    where = f"pod {namespace}/{name}"
    try:
        fresh = kube.get_pod(namespace=namespace, name=name)
    except KubeAPIError as exc:
        raise Unavailable(f"binding {where} to {node}: {failure}; and its state cannot be read back ({exc})") from failure
    if fresh is None or (uid and pods.uid(fresh) != uid):
        raise NotFound(f"{where} (uid {uid}) was deleted while binding") from failure
    bound_to = pods.node_name(fresh)
    if bound_to == node and _carries(fresh, annotations):
        log.info("binding %s to %s answered %s, but it is bound: done", where, node, failure.status)
        return
    _roll_back(kube, fresh, annotations)
    if bound_to:
        raise Conflict(f"{where} was bound to node {bound_to} by someone else; not {node}") from failure
    raise BindFailed(f"binding {where} to {node} failed: {failure}; its allocation annotations were removed") from failure


def _roll_back(kube: Kube, pod: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
    if not _carries(pod, annotations):
        return  # someone else's annotations now: not ours to remove
    meta = pods.meta(pod)
    try:
        kube.patch_pod_metadata(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            metadata={"annotations": dict.fromkeys(_ANNOTATION_KEYS)},
        )
    except KubeAPIError as exc:
        # Harmless: an unbound pod's annotation is never counted, and the next bind overwrites it.
        log.warning("could not remove allocation annotations from %s: %s", pods.key(pod), exc)


def _carries(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> bool:
    have = pods.annotations_of(pod)
    return all(have.get(k) == v for k, v in annotations.items())
