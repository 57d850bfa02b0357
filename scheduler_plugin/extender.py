"""The kube-scheduler HTTP extender: `filter`, `prioritize` and `bind` with kube-scheduler's own JSON.

The shapes are those of `k8s.io/kube-scheduler/extender/v1` (types.go). Those
Go structs carry no json tags, so kube-scheduler writes the Go field names
(`Pod`, `Nodes`, `NodeNames`, `FailedNodes`, `FailedAndUnresolvableNodes`,
`Error`, `PodName`, `PodNamespace`, `PodUID`, `Node`, `Host`, `Score`) and
reads keys case-insensitively. We read keys case-insensitively too (so a
hand-written `nodenames` works) and answer with the Go names:

    POST <prefix>/filter      ExtenderArgs        -> ExtenderFilterResult
    POST <prefix>/prioritize  ExtenderArgs        -> HostPriorityList (scores 0..10)
    POST <prefix>/bind        ExtenderBindingArgs -> ExtenderBindingResult
    GET  /healthz (state loaded), /readyz (loaded and leading), /metrics

With `nodeCacheCapable: true` kube-scheduler sends `NodeNames` and expects
`NodeNames` back; otherwise it sends a NodeList in `Nodes` and expects the
passing Node objects back. Errors of the scheduling kind travel in the
protocol's own `Error` field; only a request that is not the protocol at all
gets an HTTP error status.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from apis import names
from apis.request import RequestError
from scheduler_plugin import errors, pods
from scheduler_plugin.errors import InvalidRequest, NotFound
from scheduler_plugin.scheduling import SchedulingService

log = logging.getLogger(__name__)

JSON = dict[str, Any]

#: kube-scheduler's MaxExtenderPriority: extender scores are 0..10.
MAX_EXTENDER_PRIORITY = 10

#: Resources kube-scheduler should consult us for (extender `managedResources`).
#: Vendor resources are translated by rules (config), so they are listed in
#: the deployment manifest, not here.
MANAGED_RESOURCES = (*names.KOORDINATOR_RESOURCES, names.NVIDIA_GPU)

#: Pods remembered from filter for the bind that follows (bind args carry only names).
_POD_CACHE_SIZE = 10_000
_MAX_BODY = 64 * 1024 * 1024


def field(obj: Mapping[str, Any], name: str) -> Any:
    """A key of a Go-encoded object, matched case-insensitively as encoding/json does."""
    if name in obj:
        return obj[name]
    lowered = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


class Extender:
    """The three verbs as functions from decoded JSON to JSON (no HTTP)."""

    def __init__(self, service: SchedulingService) -> None:
        self._service = service
        self._pods: OrderedDict[str, JSON] = OrderedDict()
        self._lock = threading.Lock()

    def filter(self, args: Mapping[str, Any]) -> JSON:
        pod = _pod_arg(args)
        node_objects, node_names = _candidates(args)
        self._remember(pod)
        result: JSON = {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        try:
            request = self._service.request(pod)
        except RequestError as exc:
            message = f"pod request is invalid: {errors.describe(exc)}"
            result["FailedAndUnresolvableNodes"] = dict.fromkeys(node_names, message)
            return _with_passing(result, node_objects, [])
        except errors.ServiceError as exc:
            result["Error"] = errors.describe(exc)
            return result
        if request.device is None:
            # Not ours to judge: kube-scheduler's own plugins decide CPU/memory/affinity.
            return _with_passing(result, node_objects, node_names)
        try:
            outcome = self._service.filter(pod, node_names, request=request)
        except errors.ServiceError as exc:
            result["Error"] = errors.describe(exc)
            return result
        passing: list[str] = []
        for verdict in outcome.verdicts:
            if verdict.feasible:
                passing.append(verdict.node_name)
            elif verdict.unresolvable:
                result["FailedAndUnresolvableNodes"][verdict.node_name] = verdict.reason
            else:
                result["FailedNodes"][verdict.node_name] = verdict.reason
        return _with_passing(result, node_objects, passing)

    def prioritize(self, args: Mapping[str, Any]) -> list[JSON]:
        pod = _pod_arg(args)
        _, node_names = _candidates(args)
        try:
            request = self._service.request(pod)
        except (RequestError, errors.ServiceError):
            return [{"Host": n, "Score": 0} for n in node_names]
        if request.device is None or not node_names:
            return [{"Host": n, "Score": 0} for n in node_names]
        scored, chosen = self._service.score_and_choose(pod, node_names, request=request)
        scores: dict[str, int] = {str(n): _extender_score(s) for n, s in scored}
        # 0..10 is too coarse for the core's scores, and kube-scheduler breaks ties among equal
        # extender scores with its own plugins (which spread). The node the core would pick
        # alone gets the top score and the others at most one less: with the extender's weight
        # (5 in hack/deploy, so a 50-point lead) kube-scheduler follows it unless its own
        # plugins disagree by more than that.
        for n in node_names:
            scores[n] = MAX_EXTENDER_PRIORITY if n == chosen else min(scores.get(n, 0), MAX_EXTENDER_PRIORITY - 1)
        return [{"Host": n, "Score": scores[n]} for n in node_names]

    def bind(self, args: Mapping[str, Any]) -> JSON:
        name = str(field(args, "PodName") or "")
        namespace = str(field(args, "PodNamespace") or "default")
        uid = str(field(args, "PodUID") or "")
        node = str(field(args, "Node") or "")
        if not name or not node:
            raise InvalidRequest("ExtenderBindingArgs: PodName and Node are required")
        try:
            pod = self._pod_for_bind(namespace=namespace, name=name, uid=uid)
            self._service.bind(pod, node)
        except (errors.ServiceError, RequestError) as exc:
            log.info("extender bind of %s/%s to %s failed: %s", namespace, name, node, errors.describe(exc))
            return {"Error": errors.describe(exc)}
        with self._lock:
            self._pods.pop(uid, None)
        return {"Error": ""}

    def _remember(self, pod: JSON) -> None:
        uid = pods.uid(pod)
        if not uid:
            return
        with self._lock:
            self._pods[uid] = pod
            self._pods.move_to_end(uid)
            while len(self._pods) > _POD_CACHE_SIZE:
                self._pods.popitem(last=False)

    def _pod_for_bind(self, *, namespace: str, name: str, uid: str) -> JSON:
        with self._lock:
            cached = self._pods.get(uid)
        if cached is not None:
            return cached
        pod = self._service.get_pod(namespace=namespace, name=name)
        if pod is None:
            raise NotFound(f"pod {namespace}/{name} not found; it may have been deleted")
        if uid and pods.uid(pod) != uid:
            raise NotFound(f"pod {namespace}/{name} has uid {pods.uid(pod)}, not {uid}: it was recreated")
        return pod


def _pod_arg(args: Mapping[str, Any]) -> JSON:
    pod = field(args, "Pod")
    if not isinstance(pod, dict):
        raise InvalidRequest("ExtenderArgs.Pod: required, a Pod object")
    return pod


def _candidates(args: Mapping[str, Any]) -> tuple[list[JSON] | None, list[str]]:
    """(node objects or None when only names were sent, node names)."""
    node_names = field(args, "NodeNames")
    if node_names is not None:
        if not isinstance(node_names, list):
            raise InvalidRequest("ExtenderArgs.NodeNames: expected a list of node names")
        for index, name in enumerate(node_names):
            # str() would turn null or 5 into a node called "None" or "5".
            if not isinstance(name, str) or not name:
                raise InvalidRequest(
                    f"ExtenderArgs.NodeNames[{index}]: {json.dumps(name)} is not a node name; "
                    'send node names as non-empty strings, e.g. ["gpu-node-1"]'
                )
        return None, list(node_names)
    nodes = field(args, "Nodes")
    if nodes is None:
        return None, []
    items = nodes.get("items") if isinstance(nodes, Mapping) else None
    if not isinstance(items, list):
        raise InvalidRequest("ExtenderArgs.Nodes: expected a NodeList with items")
    objects = [n for n in items if isinstance(n, dict)]
    return objects, [str((n.get("metadata") or {}).get("name", "")) for n in objects]


def _with_passing(result: JSON, node_objects: list[JSON] | None, passing: list[str]) -> JSON:
    if node_objects is None:
        result["NodeNames"] = list(passing)
    else:
        keep = set(passing)
        result["Nodes"] = {
            "metadata": {},
            "items": [n for n in node_objects if (n.get("metadata") or {}).get("name") in keep],
        }
    return result


def _extender_score(score: int) -> int:
    """The core's 0..100 as kube-scheduler's 0..10, rounding half up."""
    bounded = max(0, min(100, int(score)))
    return (bounded * MAX_EXTENDER_PRIORITY + 50) // 100


class ExtenderServer:
    """HTTP server for the extender verbs, /healthz and /metrics."""

    def __init__(self, service: SchedulingService, *, address: str) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise InvalidRequest(f"--extender-listen={address!r}: expected HOST:PORT, e.g. 0.0.0.0:9444")
        self.extender = Extender(service)
        self._service = service
        handler = _handler_class(self)
        self._httpd = ThreadingHTTPServer((host or "0.0.0.0", int(port)), handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        # A short poll interval: shutdown() waits for it, and stop should be prompt.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fgpu-extender", daemon=True
        )
        self._thread.start()

    def stop(self, grace: float | None = None) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(grace)

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) for one request."""
        verb = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if method == "GET" and verb == "healthz":  # liveness: the state is loaded
            ok = self._service.ready
            return (200 if ok else 503), "text/plain", b"ok" if ok else b"loading"
        if method == "GET" and verb == "readyz":  # readiness: route traffic to the leader only
            if not self._service.ready:
                return 503, "text/plain", b"loading"
            return (200, "text/plain", b"ok") if self._service.leading else (503, "text/plain", b"standby")
        if method == "GET" and verb == "metrics":
            return 200, "text/plain; version=0.0.4", self._service.metrics.exposition()
        if verb not in ("filter", "prioritize", "bind"):
            return 404, "text/plain", f"unknown path {path}; use .../filter, .../prioritize or .../bind".encode()
        if method != "POST":
            return 405, "text/plain", f"{verb}: use POST".encode()
        try:
            try:
                args = json.loads(body or b"null")
            except ValueError as exc:
                raise InvalidRequest(f"{verb}: body is not JSON ({exc})") from exc
            if not isinstance(args, dict):
                raise InvalidRequest(f"{verb}: expected a JSON object, got {type(args).__name__}")
            result: Any = getattr(self.extender, verb)(args)
        except errors.ServiceError as exc:
            return errors.http_status(exc), "text/plain", errors.describe(exc).encode()
        return 200, "application/json", json.dumps(result, separators=(",", ":")).encode()


def _handler_class(server: ExtenderServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._respond(*server.handle("GET", self.path, b""))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > _MAX_BODY:
                self._respond(413, "text/plain", b"request body too large")
                return
            self._respond(*server.handle("POST", self.path, self.rfile.read(length)))

        def _respond(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("extender %s", format % args)

    return Handler
