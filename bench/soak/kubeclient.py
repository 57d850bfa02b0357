"""A tiny JSON client for the Kubernetes API (the double), as kubectl and kubelet use it.

Every call goes over HTTP, so the API faults the soak injects hit the
workload generator and the kubelet drivers as they hit the daemons. One
short-lived connection per call: a fault that cuts connections costs one call.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

PODS = "/api/v1/namespaces/{ns}/pods"
ALL_PODS = "/api/v1/pods"
NODES = "/api/v1/nodes"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}"
DEVICES = "/apis/scheduling.koordinator.sh/v1alpha1/devices"


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Client:
    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        parts = urllib.parse.urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._timeout_s = timeout_s

    def call(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": content_type, "Accept": "application/json"}
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                raise ApiError(0, f"{method} {path}: {exc!r}") from None
            if response.status >= 400:
                raise ApiError(response.status, f"{method} {path}: {raw[:200]!r}")
            return json.loads(raw) if raw else {}
        finally:
            conn.close()

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return dict(self.call("GET", path))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, path: str, **query: str) -> list[dict[str, Any]]:
        q = ("?" + urllib.parse.urlencode(query)) if query else ""
        return list(self.call("GET", path + q).get("items") or [])

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("POST", path, body))

    def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self.call("PATCH", path, body, content_type="application/merge-patch+json"))

    def delete(self, path: str, *, grace_s: int | None = None, uid: str = "") -> None:
        options: dict[str, Any] = {}
        if grace_s is not None:
            options["gracePeriodSeconds"] = grace_s
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            self.call("DELETE", path, options or None)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
