"""The agent's only door to the Kubernetes API: the one module that imports `kubernetes`.

Objects go in and come back as plain dicts in the API's camelCase JSON
(`_preload_content=False`), so `apis.devices.to_device_object` output is sent
as it is. Every call has a client-side timeout: a hung API server stalls the
reporter for seconds, not forever. Library exceptions become
`agent.errors.KubeAPIError` here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agent.errors import KubeAPIError
from apis import kubeconfig as kubeconfig_loader
from apis import names

JSON = dict[str, Any]

REQUEST_TIMEOUT_S = 10.0
_MERGE_PATCH = "application/merge-patch+json"
#: Lists merge by their key (conditions by type), so the agent's condition leaves kubelet's alone.
_STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class Kube:
    def __init__(self, api_client: client.ApiClient, *, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self._api = api_client
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._timeout = request_timeout_s

    @classmethod
    def connect(cls, *, kubeconfig: str = "", request_timeout_s: float = REQUEST_TIMEOUT_S) -> Kube:
        """From a kubeconfig file; with none given, the in-cluster service account, then ~/.kube/config.

        Raises KubeAPIError (one line naming the flag, the file and the fix) for any kubeconfig the
        client cannot use, whatever the client's loader raised for it.
        """
        return cls(_api_client(kubeconfig), request_timeout_s=request_timeout_s)

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    # --- nodes ---------------------------------------------------------------------------

    def get_node(self, name: str) -> JSON | None:
        return self._get(self._core.read_node, name=name)

    def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> JSON:
        """Merge-patches labels; a None value removes the label."""
        return _json(self._call(self._core.patch_node, name=name, body={"metadata": {"labels": labels}},
                                _content_type=_MERGE_PATCH))

    def patch_node_annotations(self, name: str, annotations: dict[str, str | None], *, resource_version: str = "") -> JSON:
        """Merge-patches annotations; a None value removes one. With `resource_version`, 409 when the
        Node changed since it was read (so a key removed here is the one that was read)."""
        metadata: JSON = {"annotations": annotations}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return _json(self._call(self._core.patch_node, name=name, body={"metadata": metadata}, _content_type=_MERGE_PATCH))

    def patch_node_status(self, name: str, status: JSON) -> JSON:
        return _json(self._call(self._core.patch_node_status, name=name, body={"status": status},
                                _content_type=_MERGE_PATCH))

    def patch_node_conditions(self, name: str, conditions: list[JSON]) -> JSON:
        """Sets these conditions on the node, each merged by its type; the others stay as they are."""
        return _json(self._call(self._core.patch_node_status, name=name, body={"status": {"conditions": conditions}},
                                _content_type=_STRATEGIC_PATCH))

    # --- events --------------------------------------------------------------------------

    def create_event(self, namespace: str, body: JSON) -> JSON:
        return _json(self._call(self._core.create_namespaced_event, namespace=namespace, body=body))

    # --- pods ----------------------------------------------------------------------------

    def list_pods_on_node(self, node_name: str) -> list[JSON]:
        """Every pod bound to `node_name`, in every namespace."""
        listed = _json(self._call(self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node_name}"))
        items = listed.get("items")
        if not isinstance(items, list):
            raise KubeAPIError(f"Kubernetes API: pod list has items={items!r}, expected a list")
        return [item for item in items if isinstance(item, dict)]

    def delete_pod(self, namespace: str, name: str, *, uid: str, grace_period_s: int | None = None) -> None:
        """DELETE the pod, only if it is still the one with `uid` (409 otherwise); 404 when it is gone.

        Reclaim deletes rather than evicts (docs/overcommit.md): an admission policy can check a
        delete against the pod's node (`oldObject`), never an eviction, whose object is the Eviction.
        """
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        self._call(self._core.delete_namespaced_pod, name=name, namespace=namespace, body=body)

    # --- the Device custom resource ------------------------------------------------------

    def get_device(self, name: str) -> JSON | None:
        return self._get(self._custom.get_cluster_custom_object, name=name, **_DEVICE)

    def create_device(self, body: JSON) -> JSON:
        """POST; 409 when it exists already."""
        return _json(self._call(self._custom.create_cluster_custom_object, body=body, **_DEVICE))

    def replace_device(self, name: str, body: JSON) -> JSON:
        """PUT; 409 when body's resourceVersion is stale, 404 when it was deleted meanwhile."""
        return _json(self._call(self._custom.replace_cluster_custom_object, name=name, body=body, **_DEVICE))

    # --- plumbing --------------------------------------------------------------------------

    def _get(self, func: Callable[..., Any], **kwargs: Any) -> JSON | None:
        try:
            return _json(self._call(func, **kwargs))
        except KubeAPIError as exc:
            if exc.status == 404:
                return None
            raise

    def _call(self, func: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return func(_preload_content=False, _request_timeout=self._timeout, **kwargs)
        except ApiException as exc:
            raise _api_error(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeAPIError(f"Kubernetes API unreachable: {exc}") from exc


_DEVICE = {"group": names.DEVICE_GROUP, "version": names.DEVICE_VERSION, "plural": names.DEVICE_PLURAL}


def _json(response: Any) -> JSON:
    data = json.loads(response.data or b"{}")
    if not isinstance(data, dict):
        raise KubeAPIError(f"Kubernetes API returned {type(data).__name__}, expected an object")
    return data


def _api_error(exc: ApiException) -> KubeAPIError:
    status = int(exc.status or 0)
    message = str(exc.reason or "")
    if exc.body:
        try:
            body = json.loads(exc.body)
        except (TypeError, ValueError):
            body = None
        if isinstance(body, dict):
            message = str(body.get("message") or message)
    return KubeAPIError(f"Kubernetes API: {status} {message}".strip(), status=status)


def _api_client(kubeconfig: str) -> client.ApiClient:
    try:
        return kubeconfig_loader.api_client(kubeconfig)
    except kubeconfig_loader.KubeconfigError as exc:
        raise KubeAPIError(str(exc)) from exc
