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

Who may call: the listener is loopback by default (kube-scheduler runs beside
us in the same pod); beyond loopback it requires mutual TLS, kube-scheduler
presenting the client certificate of its extender `tlsConfig`, and a node's
identity (caller_roles: `system:node:*`, or a node we know) is refused every
verb with 403: the protocol is kube-scheduler's, bind signs GPUs for any pod,
and with the embedded backend the pod filter carries is the pod bind signs. And bind
trusts no pod the caller sent: with the kubernetes backend the pod is read
from the API by name and must have the UID kube-scheduler names, so the GPUs
are chosen and signed for the pod as it really is.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from apis import names, tls
from apis.httpserver import BoundedHTTPServer, Limits, Peer, ServesHTTP
from apis.request import RequestError
from scheduler_plugin import caller_roles, errors, pods, probes, trusted_pod
from scheduler_plugin.errors import InvalidRequest
from scheduler_plugin.scheduling import SchedulingService

log = logging.getLogger(__name__)

JSON = dict[str, Any]

#: kube-scheduler's MaxExtenderPriority: extender scores are 0..10.
MAX_EXTENDER_PRIORITY = 10

#: Resources kube-scheduler should consult us for (extender `managedResources`).
#: Vendor resources are translated by rules (config), so they are listed in
#: the deployment manifest, not here.
MANAGED_RESOURCES = (*names.KOORDINATOR_RESOURCES, names.NVIDIA_GPU)

#: Pods remembered from filter for the bind that follows (bind args carry only names);
#: only without the API (embedded state), where the caller's pod is all there is.
_POD_CACHE_SIZE = 10_000

#: A pod in the filter cache: (namespace, name, uid). The UID alone is not enough: it is the
#: caller's word, and a bind must never take another pod's requests that came with the same UID.
_PodKey = tuple[str, str, str]

#: The largest request body accepted. With `nodeCacheCapable: true` (as hack/deploy configures
#: it) ExtenderArgs is the Pod plus the candidates' names: at Kubernetes' 5,000-node limit and
#: names of at most 253 characters that is at most 5,000 x 256 B = 1.3 MB of names, and the API
#: server keeps no object over 1.5 MiB (etcd's default request limit), so 4 MiB holds the largest
#: real request with room to spare while a client cannot make us buffer 64 MiB. Without
#: nodeCacheCapable the NodeList of whole Node objects (10-20 kB each) fits a few hundred nodes.
MAX_BODY_BYTES = 4 * 1024 * 1024

#: Bounds of the extender's HTTP server (apis/httpserver.py). kube-scheduler keeps a
#: few connections and binds in parallel goroutines, so 8 workers seldom queue; its extender
#: httpTimeout is 5 s in hack/deploy, well inside the 10 s a request may take to arrive. Idle
#: connections hold no thread, so they may idle 120 s: longer than Go's 90 s IdleConnTimeout, so
#: kube-scheduler closes an idle connection before we do and never sends a POST into our close.
LIMITS = Limits(
    workers=8, queue_size=64, max_connections=256, request_timeout_s=10.0, idle_timeout_s=120.0, max_body_bytes=MAX_BODY_BYTES
)


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

    def __init__(self, service: SchedulingService, *, pods_from_api: bool) -> None:
        """`pods_from_api`: bind reads the pod from the API (kubernetes backend), never from a caller."""
        self._service = service
        self._pods_from_api = pods_from_api
        self._pods: OrderedDict[_PodKey, JSON] = OrderedDict()
        self._lock = threading.Lock()

    def filter(self, args: Mapping[str, Any]) -> JSON:
        pod = _pod_arg(args)
        node_objects, node_names = _candidates(args)
        if not self._pods_from_api:
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
            self._pods.pop((namespace, name, uid), None)
        return {"Error": ""}

    def _remember(self, pod: JSON) -> None:
        uid = pods.uid(pod)
        if not uid:
            return
        key = _pod_key(pod)
        with self._lock:
            self._pods[key] = pod
            self._pods.move_to_end(key)
            while len(self._pods) > _POD_CACHE_SIZE:
                self._pods.popitem(last=False)

    def _pod_for_bind(self, *, namespace: str, name: str, uid: str) -> JSON:
        if not self._pods_from_api:
            # Only the pod filter carried under this very namespace, name and UID; another pod
            # filtered with the same UID is not this one. Without a match the state's own copy
            # (a pod bound before) is read below, or the bind is refused as not found.
            with self._lock:
                cached = self._pods.get((namespace, name, uid))
            if cached is not None:
                return cached
        # With the API, the pod a filter call carried is the caller's word, not the pod: whoever
        # could call filter could otherwise have any requests signed for the named pod.
        return trusted_pod.from_api(self._service, namespace=namespace, name=name, uid=uid)


def _pod_key(pod: Mapping[str, Any]) -> _PodKey:
    """The cache key of a pod as bind names it (namespace defaulted as bind defaults it)."""
    metadata = pods.meta(pod)
    return str(metadata.get("namespace") or "default"), str(metadata.get("name") or ""), pods.uid(pod)


def _pod_arg(args: Mapping[str, Any]) -> JSON:
    pod = field(args, "Pod")
    if not isinstance(pod, dict):
        raise InvalidRequest("ExtenderArgs.Pod: required, a Pod object")
    return pod


def _candidates(args: Mapping[str, Any]) -> tuple[list[JSON] | None, list[str]]:
    """(node objects or None when only names were sent, node names).

    Go's encoding/json writes a nil slice as null: kube-scheduler sends `NodeNames: null` when it
    sends Nodes, and a NodeList it built by appending no node has `items: null`. Both are empty, not
    malformed.
    """
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
    if not isinstance(nodes, Mapping):
        raise InvalidRequest(f"ExtenderArgs.Nodes: expected a NodeList object, got {type(nodes).__name__}")
    items = field(nodes, "items")
    if items is None:
        return [], []
    if not isinstance(items, list):
        raise InvalidRequest("ExtenderArgs.Nodes.items: expected a list of Node objects (or null for none)")
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


class ExtenderServer(ServesHTTP):
    """The extender verbs plus /healthz, /readyz and /metrics over HTTP (HTTPS with client certificates)."""

    def __init__(
        self,
        service: SchedulingService,
        *,
        address: str,
        pods_from_api: bool,
        tls_files: tls.TLSFiles = tls.TLSFiles(),
        limits: Limits = LIMITS,
    ) -> None:
        field_ = "--extender-listen"
        try:
            host, port = tls.split_hostport(address, field=field_, example="127.0.0.1:9444")
            # No host means loopback (unlike gRPC's, where it means every interface): kube-scheduler
            # calls from the same pod.
            host = host or "127.0.0.1"
            tls.check_listener(f"{host}:{port}", tls_files, field=field_, tls_key="extenderTLS")
            tls.check_complete(tls_files, field="extenderTLS", keys=("certFile", "keyFile", "clientCAFile"))
            context = tls.server_ssl_context(tls_files, field="extenderTLS") if tls_files.enabled else None
        except tls.TLSError as exc:
            raise InvalidRequest(str(exc)) from None
        self.extender = Extender(service, pods_from_api=pods_from_api)
        self._service = service
        self._mutual_tls = tls_files.enabled
        self._http = BoundedHTTPServer(
            None,
            peer_handler=self.handle,
            host=host,
            port=port,
            name="fgpu-extender",
            limits=limits,
            ssl_context=context,
            inline=lambda method, path: probes.quick_answer(service, method, path),  # probes never wait for a worker
        )

    def handle(self, method: str, path: str, body: bytes, peer: Peer) -> tuple[int, str, bytes]:
        """(status, content type, body) for one request from `peer`."""
        probe = probes.answer(self._service, method, path)
        if probe is not None:
            return probe
        verb = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if verb not in ("filter", "prioritize", "bind"):
            return 404, "text/plain", f"unknown path {path}; use .../filter, .../prioritize or .../bind".encode()
        if method != "POST":
            return 405, "text/plain", f"{verb}: use POST".encode()
        try:
            self._check_caller(verb, peer)
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

    def _check_caller(self, verb: str, peer: Peer) -> None:
        """Over mutual TLS, the caller-role rule (caller_roles): no node's identity calls a verb."""
        if not self._mutual_tls:
            return  # loopback: kube-scheduler in our own Pod
        caller_roles.check(
            cert_names=peer.cert_names,
            verb=caller_roles.Verb.SCHEDULE,
            call=f"extender {verb}",
            known_among=lambda wanted: [v.name for v in self._service.node_views(wanted)],
        )
