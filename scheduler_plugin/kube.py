"""The scheduler's only door to the Kubernetes API: the one module that imports `kubernetes`.

Everything goes through the official client and comes back as plain dicts in
the API's own camelCase JSON (`_preload_content=False`, watches with
`deserialize=False`), so the rest of the service, `apis.request.parse_pod` and
`apis.devices.from_device_object` read one shape whoever produced it. Every
call has a client-side timeout, so a hung API server stalls a caller for
seconds, not forever. Library exceptions are turned into
`errors.KubeAPIError` here, so no other module needs the client's types.

Pod writes (the Binding, metadata patches) are *fenced*: each asks the fence
(the leader lease, `leader.LeaderElector.check_lead`) first, which refuses it
or answers how long it may still take, and goes out on a client of its own
with urllib3's retries off and that time as its whole timeout. urllib3 by
default sends a request again after a connection error, each try with the
full timeout, so a Binding checked once could leave tens of seconds after its
check, when a standby may hold the lease. See docs/scheduler.md, "Leader fencing".
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from apis import kubeconfig as kubeconfig_loader
from apis import names
from scheduler_plugin.errors import KubeAPIError, WatchExpired

JSON = dict[str, Any]

#: Client-side limit of one ordinary request (seconds).
REQUEST_TIMEOUT_S = 10.0

_MERGE_PATCH = "application/merge-patch+json"

#: Called before every pod write: raises (errors.NotLeader) to refuse it, else returns the seconds the write may
#: still take (its whole client-side timeout). See `Kube.fence_pod_writes`.
WriteFence = Callable[[], float]


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    obj: JSON


@dataclass(frozen=True)
class Listing:
    items: list[JSON]
    resource_version: str


class Kube:
    """A connection to one API server."""

    def __init__(self, api_client: client.ApiClient, *, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self._api = api_client
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._coordination = client.CoordinationV1Api(api_client)
        self._policy = client.PolicyV1Api(api_client)
        self._timeout = request_timeout_s
        self._fence: WriteFence | None = None
        # Fenced writes go out once: no urllib3 retry may send them after their time is up.
        self._fenced_api = client.ApiClient(_without_retries(api_client.configuration))
        self._fenced_core = client.CoreV1Api(self._fenced_api)
        self._fenced_in_flight = 0
        self._fenced_idle = threading.Condition()

    @classmethod
    def connect(cls, *, kubeconfig: str = "", request_timeout_s: float = REQUEST_TIMEOUT_S) -> Kube:
        """From a kubeconfig file; with none given, the in-cluster service account, then ~/.kube/config.

        Raises KubeAPIError (one line naming the flag, the file and the fix) for any kubeconfig the
        client cannot use, whatever the client's loader raised for it.
        """
        return cls(_api_client(kubeconfig), request_timeout_s=request_timeout_s)

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]
        self._fenced_api.close()  # type: ignore[no-untyped-call]

    def fence_pod_writes(self, fence: WriteFence | None) -> None:
        """Makes every later pod write (metadata patch, Binding) call `fence` first; it raises to refuse the write,
        or returns the seconds the write may take, which bound its timeout.

        The leader elector installs its lease check here (`LeaderElector.start`), so the check runs right
        before each request leaves, not only when a bind begins: a leader that was paused past its
        lease cannot write a pod once it resumes. None removes the fence.
        """
        self._fence = fence

    def wait_fenced_writes(self, *, timeout_s: float) -> bool:
        """Waits until no fenced write is in flight (at most `timeout_s`); False if one still is.

        A write counts from before its fence check, so once the fence refuses every new write, a
        True here means no write admitted by it can still reach the API server.
        """
        with self._fenced_idle:
            return self._fenced_idle.wait_for(lambda: self._fenced_in_flight == 0, timeout=max(0.0, timeout_s))

    # --- pods ---------------------------------------------------------------

    def list_pods(self) -> Listing:
        return _listing(self._call(self._core.list_pod_for_all_namespaces))

    def watch_pods(self, *, resource_version: str, timeout_s: int) -> WatchStream:
        return self._watch(self._core.list_pod_for_all_namespaces, resource_version=resource_version, timeout_s=timeout_s)

    def get_pod(self, *, namespace: str, name: str, timeout_s: float | None = None) -> JSON | None:
        """The pod, or None when there is none; `timeout_s` shortens the request timeout."""
        try:
            return _json(self._call(self._core.read_namespaced_pod, timeout_s=timeout_s, name=name, namespace=namespace))
        except KubeAPIError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_pod_metadata(self, *, namespace: str, name: str, metadata: JSON) -> JSON:
        """Merge-patches metadata (labels/annotations; a None value removes a key). Fenced."""
        return _json(
            self._fenced_call(
                self._fenced_core.patch_namespaced_pod,
                timeout_s=None,
                name=name,
                namespace=namespace,
                body={"metadata": metadata},
                _content_type=_MERGE_PATCH,
            )
        )

    def bind_pod(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        resource_version: str = "",
        annotations: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """POST pods/binding: sets spec.nodeName and merges `annotations` into the pod in one write. Fenced.

        kube-apiserver applies both atomically (BindingREST.setPodHostAndAnnotations), and refuses
        with 409 a pod that is bound already, or whose uid or resourceVersion is not the given one.
        `timeout_s` shortens the timeout further than the fence does.
        """
        metadata: JSON = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        if resource_version:
            metadata["resourceVersion"] = resource_version
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self._fenced_call(
            self._fenced_core.create_namespaced_pod_binding, timeout_s=timeout_s, name=name, namespace=namespace, body=body
        )

    # --- nodes and devices ---------------------------------------------------

    def list_nodes(self) -> Listing:
        return _listing(self._call(self._core.list_node))

    def watch_nodes(self, *, resource_version: str, timeout_s: int) -> WatchStream:
        return self._watch(self._core.list_node, resource_version=resource_version, timeout_s=timeout_s)

    def get_node(self, name: str) -> JSON | None:
        """The Node, or None when there is none."""
        try:
            return _json(self._call(self._core.read_node, name=name))
        except KubeAPIError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_node_metadata(
        self, name: str, *, annotations: dict[str, str | None] | None = None, labels: dict[str, str | None] | None = None
    ) -> JSON:
        """Merge-patches the Node's annotations and labels (a None value removes a key)."""
        metadata: JSON = {}
        if annotations is not None:
            metadata["annotations"] = annotations
        if labels is not None:
            metadata["labels"] = labels
        return _json(self._call(self._core.patch_node, name=name, body={"metadata": metadata}, _content_type=_MERGE_PATCH))

    def list_devices(self) -> Listing:
        return _listing(
            self._call(
                self._custom.list_cluster_custom_object,
                group=names.DEVICE_GROUP,
                version=names.DEVICE_VERSION,
                plural=names.DEVICE_PLURAL,
            )
        )

    def watch_devices(self, *, resource_version: str, timeout_s: int) -> WatchStream:
        return self._watch(
            self._custom.list_cluster_custom_object,
            group=names.DEVICE_GROUP,
            version=names.DEVICE_VERSION,
            plural=names.DEVICE_PLURAL,
            resource_version=resource_version,
            timeout_s=timeout_s,
        )

    def list_pod_disruption_budgets(self) -> Listing:
        """policy/v1 PodDisruptionBudgets of all namespaces (read by `fgpuctl defrag-plan`)."""
        return _listing(self._call(self._policy.list_pod_disruption_budget_for_all_namespaces))

    def evict_pod(
        self, namespace: str, name: str, *, dry_run: bool = False, grace: int | None = None, uid: str = ""
    ) -> None:
        """POST pods/<name>/eviction (policy/v1): the API server enforces PodDisruptionBudgets.

        A budget that forbids it answers 429 (`KubeAPIError.status`), a pod already gone 404.
        `dry_run`: the server checks everything and deletes nothing; `grace`: the pod's
        termination grace period in seconds (None: the pod's own); `uid`: evict only that pod
        (`deleteOptions.preconditions.uid`), so a pod recreated under the same name (a
        StatefulSet's) answers 409 instead of being evicted in its place.
        """
        body: JSON = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        options: JSON = {}
        if uid:
            options["preconditions"] = {"uid": uid}
        if dry_run:
            options["dryRun"] = ["All"]
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        if options:
            body["deleteOptions"] = options
        self._call(self._core.create_namespaced_pod_eviction, name=name, namespace=namespace, body=body)

    # --- workload controllers (read by the descheduler: does a pod's owner recreate it?) ---

    def list_replica_sets(self) -> Listing:
        """apps/v1 ReplicaSets of all namespaces (list items carry no apiVersion/kind)."""
        return _listing(self._call(client.AppsV1Api(self._api).list_replica_set_for_all_namespaces))

    def list_stateful_sets(self) -> Listing:
        """apps/v1 StatefulSets of all namespaces."""
        return _listing(self._call(client.AppsV1Api(self._api).list_stateful_set_for_all_namespaces))

    def list_jobs(self) -> Listing:
        """batch/v1 Jobs of all namespaces."""
        return _listing(self._call(client.BatchV1Api(self._api).list_job_for_all_namespaces))

    def list_events(self, *, field_selector: str = "") -> Listing:
        """core/v1 Events of all namespaces, e.g. `field_selector="reason=DefragEvicted"`."""
        return _listing(self._call(self._core.list_event_for_all_namespaces, field_selector=field_selector))

    def get_config_map(self, *, namespace: str, name: str) -> JSON | None:
        """The ConfigMap, or None when there is none."""
        try:
            return _json(self._call(self._core.read_namespaced_config_map, name=name, namespace=namespace))
        except KubeAPIError as exc:
            if exc.status == 404:
                return None
            raise

    def create_config_map(self, *, namespace: str, body: JSON) -> JSON:
        """POST; 409 when one of that name exists."""
        return _json(self._call(self._core.create_namespaced_config_map, namespace=namespace, body=body))

    # --- namespaces ----------------------------------------------------------

    def list_namespaces(self) -> Listing:
        return _listing(self._call(self._core.list_namespace))

    # --- events and leases ---------------------------------------------------

    def create_event(self, namespace: str, body: JSON) -> None:
        self._call(self._core.create_namespaced_event, namespace=namespace, body=body)

    def get_lease(self, *, namespace: str, name: str) -> JSON | None:
        try:
            return _json(self._call(self._coordination.read_namespaced_lease, name=name, namespace=namespace))
        except KubeAPIError as exc:
            if exc.status == 404:
                return None
            raise

    def create_lease(self, *, namespace: str, body: JSON) -> JSON:
        return _json(self._call(self._coordination.create_namespaced_lease, namespace=namespace, body=body))

    def replace_lease(self, *, namespace: str, name: str, body: JSON) -> JSON:
        """PUT; 409 when body's resourceVersion is stale (someone else wrote the lease)."""
        return _json(
            self._call(self._coordination.replace_namespaced_lease, name=name, namespace=namespace, body=body)
        )

    # --- plumbing ------------------------------------------------------------

    def _fenced_call(self, func: Callable[..., Any], *, timeout_s: float | None, **kwargs: Any) -> Any:
        """One pod write: counted in flight from before the fence check, sent once, within the fence's time."""
        with self._fenced_idle:
            self._fenced_in_flight += 1
        try:
            limit = self._timeout if timeout_s is None else min(self._timeout, timeout_s)
            fence = self._fence
            if fence is not None:
                limit = min(limit, fence())
            if limit <= 0:
                raise KubeAPIError(f"no time left for this pod write (limit {limit:.2f}s); it was not sent")
            return self._call(func, timeout_s=limit, **kwargs)
        finally:
            with self._fenced_idle:
                self._fenced_in_flight -= 1
                self._fenced_idle.notify_all()

    def _call(self, func: Callable[..., Any], *, timeout_s: float | None = None, **kwargs: Any) -> Any:
        timeout = self._timeout if timeout_s is None else min(self._timeout, timeout_s)
        try:
            return func(_preload_content=False, _request_timeout=timeout, **kwargs)
        except ApiException as exc:
            raise _api_error(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeAPIError(f"Kubernetes API unreachable: {exc}") from exc

    def _watch(self, func: Callable[..., Any], *, resource_version: str, timeout_s: int, **kwargs: Any) -> WatchStream:
        return WatchStream(
            func,
            resource_version=resource_version,
            timeout_s=timeout_s,
            request_timeout_s=self._timeout,
            **kwargs,
        )


class WatchStream:
    """Events after a resourceVersion until the server ends the watch (about `timeout_s`).

    The request goes through the official client (`watch=True`,
    `_preload_content=False`); lines are decoded here rather than by
    `kubernetes.watch.Watch`, whose `deserialize=False` mode cannot read an
    ERROR event. Iterating raises WatchExpired on 410 Gone (the caller lists
    again) and KubeAPIError on other errors or a broken connection. `stop()`
    from another thread ends the iteration promptly.
    """

    def __init__(
        self, func: Callable[..., Any], *, resource_version: str, timeout_s: int, request_timeout_s: float, **kwargs: Any
    ) -> None:
        self._func = func
        self._kwargs = {
            "watch": True,
            "resource_version": resource_version,
            "timeout_seconds": timeout_s,
            "allow_watch_bookmarks": True,
            "_preload_content": False,
            "_request_timeout": (request_timeout_s, timeout_s + request_timeout_s),
            **kwargs,
        }
        self._response: Any = None
        self._stopped = False

    def __iter__(self) -> Iterator[WatchEvent]:
        try:
            self._response = self._func(**self._kwargs)
            for line in watch.watch.iter_resp_lines(self._response):  # type: ignore[no-untyped-call]
                if self._stopped:
                    return
                if not line:
                    continue
                event = json.loads(line)
                kind = str(event.get("type", ""))
                obj = event.get("object") or {}
                if kind == "ERROR":
                    status = int(obj.get("code") or 0)
                    message = f"Kubernetes watch: {status} {obj.get('reason', '')} {obj.get('message', '')}".strip()
                    raise (WatchExpired if status == 410 else KubeAPIError)(message, status=status, reason=str(obj.get("reason", "")))
                yield WatchEvent(type=kind, obj=obj)
        except ApiException as exc:
            raise _api_error(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if self._stopped:
                return
            raise KubeAPIError(f"Kubernetes watch broken: {exc}") from exc
        finally:
            self._close()

    def stop(self) -> None:
        self._stopped = True
        response = self._response
        if response is not None:
            # Shutting the socket down wakes the thread blocked reading it.
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _close(self) -> None:
        response, self._response = self._response, None
        if response is not None:
            with contextlib.suppress(Exception):
                response.close()
                response.release_conn()


def _without_retries(configuration: client.Configuration) -> client.Configuration:
    """A copy of `configuration` (same server, credentials and their refresh hook) whose requests are sent once."""
    fenced = copy.copy(configuration)
    fenced.retries = False
    return fenced


def _json(response: Any) -> JSON:
    data = json.loads(response.data or b"{}")
    if not isinstance(data, dict):
        raise KubeAPIError(f"Kubernetes API returned {type(data).__name__}, expected an object")
    return data


def _listing(response: Any) -> Listing:
    data = _json(response)
    items = data.get("items") or []
    return Listing(items=list(items), resource_version=str((data.get("metadata") or {}).get("resourceVersion", "")))


def _api_error(exc: ApiException) -> KubeAPIError:
    status = int(exc.status or 0)
    message = str(exc.reason or "")
    reason = ""
    if exc.body:
        try:
            body = json.loads(exc.body)
        except (TypeError, ValueError):
            body = None
        if isinstance(body, dict):
            message = str(body.get("message") or message)
            reason = str(body.get("reason") or "")
    kind = WatchExpired if status == 410 else KubeAPIError
    return kind(f"Kubernetes API: {status} {reason or ''} {message}".strip(), status=status, reason=reason)


def _api_client(kubeconfig: str) -> client.ApiClient:
    try:
        return kubeconfig_loader.api_client(kubeconfig)
    except kubeconfig_loader.KubeconfigError as exc:
        raise KubeAPIError(str(exc)) from exc
