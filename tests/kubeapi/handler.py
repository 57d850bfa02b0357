"""HTTP adapter: turns requests into store calls and answers as kube-apiserver does.

Built on the standard library's `http.server` (HTTP/1.1 keep-alive, one thread
per connection), which is all the client needs; watches are chunked
responses of newline-delimited JSON events, as the real server sends them.
Any error a handler raises becomes a `Status` answer: the server never dies
of a bad request.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.kubeapi import deletion, discovery, errors, eviction, routing, selectors, watching
from tests.kubeapi.faults import Faults
from tests.kubeapi.resources import BINDINGS, ResourceInfo
from tests.kubeapi.store import Matcher, Store

log = logging.getLogger(__name__)


def _int_param(query: dict[str, str], name: str) -> int:
    text = query.get(name) or "0"
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise errors.bad_request(f"invalid {name}={text!r}: must be a non-negative integer")
    return value


def _delete_options(query: dict[str, str], body: Any) -> dict[str, Any]:
    """DeleteOptions from the body, else from the query (the client sends `gracePeriodSeconds` there)."""
    if body:
        if not isinstance(body, dict):
            raise errors.bad_request(f"the body of a delete must be DeleteOptions, got {type(body).__name__}")
        return body
    options: dict[str, Any] = {}
    if query.get("gracePeriodSeconds"):
        options["gracePeriodSeconds"] = deletion.grace_from_query(query["gracePeriodSeconds"])
    return options


class Context:
    """What all runs of the server share: state, faults, watch settings."""

    def __init__(self, *, store: Store, faults: Faults, bookmark_interval_s: float) -> None:
        self.store = store
        self.faults = faults
        self.bookmark_interval_s = bookmark_interval_s
        self.watch_generation = 0
        self._open_watches = 0
        self._watch_lock = threading.Lock()

    @property
    def open_watches(self) -> int:
        return self._open_watches

    def watch_opened(self, delta: int) -> None:
        with self._watch_lock:
            self._open_watches += delta


class HTTPServer(ThreadingHTTPServer):
    """One run of the server; `ended` releases every request and watch of this run."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], context: Context) -> None:
        self.context = context
        self.ended = threading.Event()
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up mid-watch (ENOTCONN, EPIPE, reset) is routine: informers
        # reconnect. Only a real failure deserves socketserver's traceback.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def end(self) -> None:
        """Stop serving and cut every open connection, as a crashing API server would."""
        self.ended.set()
        self.shutdown()
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self.server_close()


class _Abort(Exception):
    """Close the connection without answering (injected timeout, server stopping)."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, each answer waits for a delayed ACK (40 ms).
    disable_nagle_algorithm = True
    server: HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    # --- plumbing ---------------------------------------------------------------------

    @property
    def _ctx(self) -> Context:
        return self.server.context

    def _body(self, raw: bytes) -> Any:
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise errors.bad_request(f"the request body is not valid JSON: {exc}") from exc

    def _send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, method: str) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            fault = self._ctx.faults.take(self.path)
            if not self._ctx.faults.wait_running(self.server.ended):
                raise _Abort
            if fault is not None and fault.timeout:
                self.server.ended.wait()
                raise _Abort
            if fault is not None:
                raise errors.injected(fault.status)
            self._dispatch(method, raw)
        except errors.ApiError as exc:
            self._send_json(exc.code, exc.status())
        except _Abort:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the double must not take the server down
            log.exception("kube API double failed on %s %s", method, self.path)
            self._send_json(
                500, errors.ApiError(code=500, reason="InternalError", message=repr(exc)).status()
            )

    # --- routing ----------------------------------------------------------------------

    def _dispatch(self, method: str, raw: bytes) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        route = routing.parse(url.path)
        store = self._ctx.store
        if route.target is routing.Target.HEALTH:
            data = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if route.target is routing.Target.DISCOVERY:
            if method != "GET":
                raise errors.method_not_allowed(f"{method} is not supported on {url.path}")
            host, port = self.server.server_address[:2]
            address = f"{host!s}:{port}"
            self._send_json(
                200, discovery.document(route.segments, store.resources(), server_address=address)
            )
            return
        resource = store.resolve(route.group, route.version, route.plural)
        if resource is None:
            raise errors.path_not_found(url.path)
        if resource.namespaced is False and route.namespace is not None:
            raise errors.path_not_found(url.path)
        if route.subresource and route.subresource not in resource.subresources:
            raise errors.path_not_found(url.path)
        body = self._body(raw)
        if resource is BINDINGS or route.subresource == "binding":
            self._bind(method, route, body)
        elif route.subresource == "eviction":
            if method != "POST" or route.namespace is None:
                raise errors.method_not_allowed("pods/eviction only supports POST in a namespace")
            self._send_json(201, eviction.evict(store, route.namespace, route.name, body, now=store.now()))
        elif route.target is routing.Target.COLLECTION:
            self._collection(method, resource, route, query, body)
        else:
            self._object(method, resource, route, _delete_options(query, body) if method == "DELETE" else body)

    def _bind(self, method: str, route: routing.Route, body: Any) -> None:
        if method != "POST" or route.namespace is None:
            raise errors.method_not_allowed("bindings only support POST in a namespace")
        name = (
            route.name if route.subresource == "binding" else (body or {}).get("metadata", {}).get("name", "")
        )
        if not name:
            raise errors.bad_request("a Binding needs metadata.name: the pod to bind")
        self._send_json(201, self._ctx.store.bind(route.namespace, name, body))

    def _matcher(self, resource: ResourceInfo, query: dict[str, str]) -> Matcher:
        labels = selectors.parse_labels(query.get("labelSelector"))
        fields = selectors.parse_fields(
            query.get("fieldSelector"), allowed=resource.field_labels, kind=resource.kind
        )
        return selectors.object_matcher(labels, fields)

    def _collection(
        self, method: str, resource: ResourceInfo, route: routing.Route, query: dict[str, str], body: Any
    ) -> None:
        store = self._ctx.store
        if method == "GET":
            matcher = self._matcher(resource, query)
            if route.watch or query.get("watch") in ("true", "1"):
                self._watch(resource, route, query, matcher)
                return
            limit = _int_param(query, "limit")
            self._send_json(
                200,
                store.list_objects(
                    resource, route.namespace, matcher, limit=limit, continue_token=query.get("continue", "")
                ),
            )
        elif method == "POST":
            self._send_json(201, store.create(resource, route.namespace, body))
        elif method == "DELETE":
            self._send_json(
                200,
                store.delete_collection(
                    resource, route.namespace, self._matcher(resource, query), _delete_options(query, body)
                ),
            )
        else:
            raise errors.method_not_allowed(f"{method} is not supported on a collection; name an object")

    def _object(self, method: str, resource: ResourceInfo, route: routing.Route, body: Any) -> None:
        store = self._ctx.store
        sub = route.subresource or None
        if method == "GET":
            self._send_json(200, store.get(resource, route.namespace, route.name))
        elif method == "PUT":
            self._send_json(200, store.update(resource, route.namespace, route.name, body, subresource=sub))
        elif method == "PATCH":
            content_type = self.headers.get("Content-Type", "")
            self._send_json(
                200, store.patch(resource, route.namespace, route.name, content_type, body, subresource=sub)
            )
        elif method == "DELETE" and sub is None:
            self._send_json(200, store.delete(resource, route.namespace, route.name, body))
        else:
            raise errors.method_not_allowed(f"{method} is not supported on {self.path}")

    # --- watch ------------------------------------------------------------------------

    def _watch(
        self, resource: ResourceInfo, route: routing.Route, query: dict[str, str], matcher: Matcher
    ) -> None:
        timeout = query.get("timeoutSeconds")
        request = watching.WatchRequest(
            resource=resource,
            namespace=route.namespace,
            matcher=matcher,
            resource_version=query.get("resourceVersion", ""),
            timeout_s=_int_param(query, "timeoutSeconds") if timeout else None,
            bookmarks=query.get("allowWatchBookmarks") in ("true", "1"),
            send_initial_events=query.get("sendInitialEvents") in ("true", "1"),
        )
        if request.resource_version not in ("", "0"):
            watching.parse_resource_version(request.resource_version)
        generation = self._ctx.watch_generation
        ended = self.server.ended

        def stopped() -> bool:
            return ended.is_set() or self._ctx.watch_generation != generation or self._client_gone()

        events = watching.stream(
            self._ctx.store,
            request,
            stopped=stopped,
            paused=lambda: self._ctx.faults.paused,
            bookmark_interval_s=self._ctx.bookmark_interval_s,
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._ctx.watch_opened(+1)
        try:
            self._write_chunks(events)
        finally:
            self._ctx.watch_opened(-1)
        if stopped():
            # Dropped, not finished: cut the connection without the final chunk.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(b"0\r\n\r\n")

    def _client_gone(self) -> bool:
        """True once the client closed its end, so an idle watch does not outlive its caller."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True

    def _write_chunks(self, events: Iterator[watching.Event]) -> None:
        for event in events:
            data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
