"""Binding through the Kubernetes API: one `pods/binding` write that carries the signed annotations.

The node agent trusts only what is on the pod when its container is created,
so the allocation must be on the pod no later than the pod is on the node.
kube-apiserver's Binding merges the Binding's own annotations into the pod in
the same write that sets `spec.nodeName`, so the two cannot disagree: a pod
is never bound without its allocation, never carries an allocation for a
node it is not bound to (another scheduler's annotations are overwritten in
that write), and a failed bind leaves nothing behind to roll back.

* The Binding carries the pod's uid and resourceVersion, so it lands only on
  the pod as it was read: not on a namesake, not on a pod someone changed
  meanwhile. On a conflict the pod is read again: bound to our node with our
  annotations is success (a retry of a bind that happened), bound elsewhere
  is `Conflict`, still unbound is tried again with the fresh version.
* Every write passes the Kube's write fence (`LeaderElector.check_lead`):
  a leader deposed while this ran writes nothing (`NotLeader`).
* The call fails otherwise -> the pod is read: bound to our node with our
  annotations means the answer was lost -> success; unbound -> `BindFailed`
  (nothing was written); bound elsewhere -> `Conflict`.
* The outcome cannot be learned (API down) -> `Unavailable`; the caller keeps
  its reservation until the pod shows up bound (counted from its annotation)
  or the reservation expires, so the GPU is neither counted twice nor lost.
* All of it takes at most `BIND_TIMEOUT_S`: each request gets what is left
  (a Binding leaves `_READ_BACK_S` for reading the pod back), so the caller
  answers kube-scheduler before its extender `httpTimeout` runs out and it
  retries the pod, perhaps on another node, while this bind could still land.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from scheduler_plugin import pods
from scheduler_plugin.errors import BindFailed, Conflict, KubeAPIError, NotFound, Unavailable
from scheduler_plugin.kube import Kube

log = logging.getLogger(__name__)

_ATTEMPTS = 3

#: The longest one bind takes, all its requests together. It must stay under kube-scheduler's
#: extender `httpTimeout` (5 s in hack/deploy/20-kube-scheduler-config.yaml), with room for the
#: request's wait for a worker, the reserve and the signing: past that timeout kube-scheduler
#: gives up on the answer and retries the pod, perhaps on another node (docs/scheduler.md).
BIND_TIMEOUT_S = 4.0
#: Of that, what a Binding leaves for reading the pod back when it fails (`_settle`).
_READ_BACK_S = 1.0


def bind(
    kube: Kube,
    *,
    pod: Mapping[str, Any],
    node: str,
    annotations: Mapping[str, str],
    timeout_s: float = BIND_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    deadline = clock() + timeout_s
    meta = pods.meta(pod)
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    where = f"pod {namespace}/{name}"

    def left() -> float:
        """What a request may take now, keeping the read-back's share."""
        return deadline - _READ_BACK_S - clock()

    current: Mapping[str, Any] = pod
    failure = KubeAPIError(f"binding {where} to {node}: no time left within {timeout_s:g}s")
    for attempt in range(_ATTEMPTS):
        bound_to = pods.node_name(current)
        if bound_to:
            if bound_to == node and _carries(current, annotations):
                return  # a retry of a bind that already happened
            raise Conflict(f"{where} is bound to node {bound_to} already; not binding it to {node}")
        if left() <= 0:
            break
        try:
            kube.bind_pod(
                namespace=namespace,
                name=name,
                uid=uid,
                node=node,
                resource_version=str(pods.meta(current).get("resourceVersion") or ""),
                annotations=annotations,
                timeout_s=left(),
            )
            return
        except KubeAPIError as exc:
            if exc.status == 404:
                raise NotFound(f"{where} not found; it was deleted") from exc
            failure = exc
            if exc.status != 409 or attempt == _ATTEMPTS - 1 or left() <= 0:
                break
            fresh = kube.get_pod(namespace=namespace, name=name, timeout_s=left())
            if fresh is None or (uid and pods.uid(fresh) != uid):
                raise NotFound(f"{where} (uid {uid}) is gone or was recreated") from exc
            current = fresh
    _settle(
        kube,
        namespace=namespace,
        name=name,
        uid=uid,
        node=node,
        annotations=annotations,
        failure=failure,
        timeout_s=deadline - clock(),
    )


def _settle(
    kube: Kube,
    *,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    annotations: Mapping[str, str],
    failure: KubeAPIError,
    timeout_s: float,
) -> None:
    """After a failed Binding: find out whether it happened anyway."""
    where = f"pod {namespace}/{name}"
    try:
        if timeout_s <= 0:
            raise KubeAPIError("no time left to read it back")
        fresh = kube.get_pod(namespace=namespace, name=name, timeout_s=timeout_s)
    except KubeAPIError as exc:
        raise Unavailable(f"binding {where} to {node}: {failure}; and its state cannot be read back ({exc})") from failure
    if fresh is None or (uid and pods.uid(fresh) != uid):
        raise NotFound(f"{where} (uid {uid}) was deleted while binding") from failure
    bound_to = pods.node_name(fresh)
    if bound_to == node and _carries(fresh, annotations):
        log.info("binding %s to %s answered %s, but it is bound: done", where, node, failure.status)
        return
    if bound_to:
        raise Conflict(f"{where} was bound to node {bound_to} by someone else; not {node}") from failure
    raise BindFailed(
        f"binding {where} to {node} failed: {failure}; nothing was written (the allocation annotations travel "
        "in the Binding, so none were left on the pod); retry the bind"
    ) from failure


def _carries(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> bool:
    have = pods.annotations_of(pod)
    return all(have.get(k) == v for k, v in annotations.items())
