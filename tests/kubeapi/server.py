"""`KubeAPIServer`: the double's public face: lifecycle, kubeconfig, seeding, faults.

    with KubeAPIServer() as api:
        api.install_crd("hack/deploy/crds/device.yaml")
        client = kubernetes.config.new_client_from_config(config_file=api.kubeconfig_path)

The kubeconfig is all production code needs. `restart()` keeps the port, so
clients reconnect to the same URL; without state, every object but the CRDs
is lost and every older resourceVersion is compacted (watchers get 410 and
must relist, as after an etcd restore).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.kubeapi import errors, routing
from tests.kubeapi.faults import Faults
from tests.kubeapi.handler import Context, HTTPServer
from tests.kubeapi.resources import CRD, PODS
from tests.kubeapi.store import Store

#: The Device CRD fgpu ships (hack/deploy/crds/device.yaml), for `install_crd`.
DEVICE_CRD = str(Path(__file__).resolve().parents[2] / "hack" / "deploy" / "crds" / "device.yaml")

_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: fgpu-double
  cluster:
    server: {url}
users:
- name: fgpu-test
  user:
    token: fgpu-double-token
contexts:
- name: fgpu-double
  context:
    cluster: fgpu-double
    user: fgpu-test
    namespace: default
current-context: fgpu-double
"""


class KubeAPIServer:
    """An in-process Kubernetes API server speaking REST and watch over real HTTP."""

    def __init__(
        self,
        *,
        history: int = 1000,
        bookmark_interval_s: float = 1.0,
        host: str = "127.0.0.1",
        port: int = 0,
        graceful_pod_deletion: bool = False,
    ) -> None:
        """`graceful_pod_deletion`: a delete of a pod bound to a node leaves it terminating
        (deletionTimestamp set) until `kubelet_confirm_deletion`, as a real cluster does; off,
        pods go at once (the registry's legacy non-graceful strategy), which most tests expect."""
        self._host = host
        self._port = port
        self._context = Context(
            store=Store(history=history, graceful_pod_deletion=graceful_pod_deletion),
            faults=Faults(),
            bookmark_interval_s=bookmark_interval_s,
        )
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._dir = tempfile.mkdtemp(prefix="fgpu-kubeapi-")
        self.kubeconfig_path = os.path.join(self._dir, "kubeconfig")

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError(
                "KubeAPIServer has no URL before start(): call start() or use it as a context manager"
            )
        return f"http://{self._host}:{self._port}"

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        if self._httpd is not None:
            return
        self._httpd = HTTPServer((self._host, self._port), self._context)
        self._port = self._httpd.server_address[1]
        with open(self.kubeconfig_path, "w", encoding="utf-8") as f:
            f.write(_KUBECONFIG.format(url=self.url))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="kube-api-double",
            daemon=True,
        )
        self._thread.start()

    def _halt(self) -> None:
        if self._httpd is None:
            return
        self._httpd.end()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def stop(self) -> None:
        self._halt()
        shutil.rmtree(self._dir, ignore_errors=True)

    def restart(self, *, keep_state: bool = True) -> None:
        """Cut every connection and come back on the same port; a pause ends, queued faults stay."""
        self._halt()
        if not keep_state:
            self._context.store.wipe()
        self._context.faults.resume()
        self.start()

    def __enter__(self) -> KubeAPIServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- faults -----------------------------------------------------------------------

    def fail_next(self, n: int, *, status: int = 500, timeout: bool = False, path_contains: str = "") -> None:
        """Fail the next n requests whose path+query contains `path_contains`: answer `status`, or hang (timeout)."""
        self._context.faults.fail_next(n, status=status, timeout=timeout, path_contains=path_contains)

    def drop_watches(self) -> None:
        """Cut every open watch connection mid-stream (clients see a broken stream and must re-watch)."""
        store = self._context.store
        with store.cond:
            self._context.watch_generation += 1
            store.cond.notify_all()

    def compact(self) -> int:
        """Forget the change history now (etcd compaction): watches resumed from before get 410 Gone."""
        from tests.kubeapi.compaction import compact

        return compact(self._context.store)

    @property
    def open_watches(self) -> int:
        """Watch streams open right now: wait on it to know a client's watch is established."""
        return self._context.open_watches

    def pause(self) -> None:
        """Requests (and watch deliveries) hang until resume(): the API is down or very slow."""
        self._context.faults.pause()

    def resume(self) -> None:
        self._context.faults.resume()
        with self._context.store.cond:
            self._context.store.cond.notify_all()

    # --- direct access for tests ----------------------------------------------------

    def _resolve(self, api_path: str, *, want: routing.Target) -> tuple[Any, routing.Route]:
        route = routing.parse(api_path)
        resource = self._context.store.resolve(route.group, route.version, route.plural)
        if route.target is not want or resource is None:
            expected = (
                "an object path such as /api/v1/nodes/n1"
                if want is routing.Target.OBJECT
                else ("a collection path such as /api/v1/namespaces/default/pods")
            )
            raise ValueError(f"{api_path!r} is not {expected} of a served resource")
        return resource, route

    def get_object(self, api_path: str) -> dict[str, Any] | None:
        """The stored object at an API path (e.g. "/api/v1/nodes/n1"), bypassing faults; None if absent."""
        resource, route = self._resolve(api_path, want=routing.Target.OBJECT)
        return self._context.store.raw(resource, route.namespace or "", route.name)

    def put_object(self, api_path_of_collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Seed an object as given (create or replace; status kept), assigning uid and resourceVersion."""
        resource, route = self._resolve(api_path_of_collection, want=routing.Target.COLLECTION)
        try:
            return self._context.store.seed(resource, route.namespace or "", obj)
        except errors.ApiError as exc:
            raise ValueError(f"put_object({api_path_of_collection!r}): {exc.message}") from exc

    def kubelet_confirm_deletion(self, namespace: str, name: str) -> dict[str, Any]:
        """Act as the pod's kubelet once its containers stopped: delete with grace 0 (bypassing faults).

        Returns what the API answers: the pod as last stored (still there while finalizers hold it)."""
        store = self._context.store
        pod = store.raw(PODS, namespace, name)
        if pod is None:
            raise ValueError(f"kubelet_confirm_deletion: no pod {namespace}/{name}; list pods to see which exist")
        options = {"gracePeriodSeconds": 0, "preconditions": {"uid": pod["metadata"]["uid"]}}
        return store.delete(PODS, namespace, name, options)

    def install_crd(self, manifest: Mapping[str, Any] | str) -> None:
        """Install (or replace) CRDs from a manifest dict or a YAML file path; their resources are served at once."""
        if isinstance(manifest, str):
            with open(manifest, encoding="utf-8") as f:
                documents = [d for d in yaml.safe_load_all(f) if d]
        else:
            documents = [dict(manifest)]
        store = self._context.store
        for document in documents:
            if document.get("kind") != CRD.kind:
                raise ValueError(f"install_crd: {document.get('kind')!r} is not a CustomResourceDefinition")
            name = (document.get("metadata") or {}).get("name", "")
            try:
                if store.raw(CRD, "", name) is None:
                    store.create(CRD, None, document)
                else:
                    store.update(CRD, None, name, {**document, "metadata": {"name": name}})
            except errors.ApiError as exc:
                raise ValueError(f"install_crd({name or manifest!r}): {exc.message}") from exc
