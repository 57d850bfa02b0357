"""The web view's HTTP server: serves `/` and `/cluster.json` at once, and samples its source in the background.

Read-only: GET and HEAD only. The server listens before anything is read: until the first sample is
in, the page says it is gathering the cluster's state (and reloads itself) and `/cluster.json` has
`"ready": false`. Two background threads refresh the document:

- the views (nodes, pods, pending reasons, fragmentation, history) every `interval_s`: one
  `Sample` per refresh, kept for `history_s` seconds (at most `history_s / interval_s + 1`);
- the defrag plan, the costly part, every `plan_interval_s` on the latest sample, within the
  planner's time budget (`ui_plan.PlanRunner`); the views never wait for it, and the page says
  which plan it shows and why (`ui_model.PlanState`).

A sample that fails keeps the last good one, with a note saying when and why; when the first one
fails, `on_first_failure` is told (`fgpuctl ui` then exits, as a source that can't be read should)
and the page shows the error while the sampler keeps trying.
"""

from __future__ import annotations

import collections
import json
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from fgpuctl import ui_model, ui_render
from fgpuctl.ui_model import Gathered, Planning, PlanState, PlanStatus, Sample
from fgpuctl.ui_plan import PlanOutcome

#: no script, no remote anything: escaped names could run nothing even if escaping were missed
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"

#: Connections served at once, and from one address. Beyond loopback anyone may connect before TLS
#: asks for a certificate, and each connection is served by a thread: past either bound one more is
#: closed at once, so strangers cannot pile up threads. The page has no script or sub-resource: a
#: browser showing it holds one or two connections.
MAX_CONNECTIONS = 16
MAX_CONNECTIONS_PER_PEER = 8
#: Each read and write of a connection (the TLS handshake's too) must progress within this, or the
#: connection is closed and its slot freed.
IO_TIMEOUT_S = 10.0


class Planner(Protocol):
    """`ui_plan.PlanRunner`'s face: make one plan within `budget_s`; `stop` ends one in progress."""

    budget_s: float

    def run(self, planning: Planning) -> PlanOutcome: ...

    def stop(self) -> None: ...


class ViewState:
    """The latest views, the plan shown beside them and the bounded history; safe to read from many threads."""

    def __init__(
        self,
        collect: Callable[[], Gathered],
        *,
        interval_s: float,
        history_s: float,
        source: str = "",
        planner: Planner | None = None,
        plan_interval_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._collect = collect
        self._clock = clock
        self.interval_s = interval_s
        self.planner = planner
        self.plan_interval_s = plan_interval_s
        self._history: deque[Sample] = deque(maxlen=max(1, int(history_s / interval_s) + 1))
        self._lock = threading.Lock()
        self._started = clock()
        self._source = source
        self._views: dict[str, Any] | None = None
        self._planning: tuple[Planning | None, float, str] = (None, 0.0, "")
        self._plan = PlanStatus(PlanState.PENDING, reason="the first plan is made once the first sample is in") if planner \
            else PlanStatus(PlanState.OFF, reason="defrag plans are turned off (--defrag-interval 0)")
        self.first_error = ""
        #: set once the first sample is in
        self.ready = threading.Event()
        #: set once the first plan attempt has settled (made, failed or stopped)
        self.planned = threading.Event()

    def _refresh_fields(self, took_s: float | None) -> dict[str, Any]:
        return {
            "intervalSeconds": self.interval_s,
            "lastTookSeconds": None if took_s is None else round(took_s, 3),
            "defragIntervalSeconds": self.plan_interval_s if self.planner else None,
            "defragBudgetSeconds": self.planner.budget_s if self.planner else None,
        }

    def refresh(self) -> bool:
        """Takes one sample of the views; False when it failed (the last good one stays, with a note)."""
        now = self._clock()
        started = time.monotonic()
        try:
            gathered = self._collect()
        except Exception as exc:  # never kills the sampler: the page says what went wrong
            with self._lock:
                if self._views is None:
                    self.first_error = str(exc)
                else:
                    notes = [n for n in self._views["notes"] if not n.startswith("refresh failed")]
                    self._views = dict(self._views, notes=[*notes, f"refresh failed at {_clock_time(now)}, showing the last sample: {exc}"])
            return False
        sample = ui_model.sample_of(gathered, now=now)
        with self._lock:
            self._history.append(sample)
            history = tuple(self._history)
        refresh = self._refresh_fields(time.monotonic() - started)
        views = ui_model.document(gathered, history=history, now=now, refresh=refresh)
        no_plan = "; ".join(gathered.notes) or "this sample can't be planned on"
        with self._lock:
            self._views = views
            self._planning = (gathered.planning, now, no_plan)
            self.first_error = ""
        self.ready.set()
        return True

    def refresh_plan(self) -> None:
        """Makes the defrag plan on the latest sample, within the planner's budget."""
        if self.planner is None:
            return
        with self._lock:
            planning, sampled_at, no_plan = self._planning
        if planning is None:
            with self._lock:
                self._plan = PlanStatus(PlanState.UNAVAILABLE, reason=no_plan)
        else:
            with self._lock:
                if self._plan.state is PlanState.PENDING:
                    self._plan = replace(self._plan, reason=f"started at {_clock_time(self._clock())}, "
                                         f"within a budget of {self.planner.budget_s:g} s")
            outcome = self.planner.run(planning)
            failure = f"{outcome.failure} (at {_clock_time(self._clock())})" if outcome.failure else ""
            with self._lock:
                self._plan = ui_model.plan_settled(self._plan, plan=outcome.plan, failure=failure, took_s=outcome.took_s,
                                                   sampled_at=sampled_at)
        self.planned.set()

    def document(self) -> dict[str, Any]:
        with self._lock:
            views, plan, error = self._views, self._plan, self.first_error
        if views is None:
            return ui_model.gathering(self._source, since=self._started, error=error, refresh=self._refresh_fields(None))
        return ui_model.with_plan(views, plan)


def _clock_time(t: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(t))


class UIServer:
    def __init__(
        self,
        state: ViewState,
        *,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        on_first_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.state = state
        self._on_first_failure = on_first_failure
        #: Host headers answered; empty: any (behind TLS the certificate names the host)
        self._hosts: set[str] = set()
        self._httpd = _BoundedThreadingServer((host, port), _handler(state, self._hosts))
        if ssl_context is None:
            self._hosts.update(allowed_hosts(*self.address))
        else:
            # The handshake then runs in the request's own thread, not in the accepting one.
            self._httpd.socket = ssl_context.wrap_socket(self._httpd.socket, server_side=True, do_handshake_on_connect=False)
        self._httpd.daemon_threads = True
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        """Listens at once; the first sample and the first plan follow in the background."""
        self._threads = [
            threading.Thread(target=self._httpd.serve_forever, args=(0.1,), name="fgpuctl-ui-http", daemon=True),
            threading.Thread(target=self._sample, name="fgpuctl-ui-sampler", daemon=True),
        ]
        if self.state.planner is not None:
            self._threads.append(threading.Thread(target=self._plan, name="fgpuctl-ui-planner", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self, grace: float) -> None:
        self._stop.set()
        if self.state.planner is not None:
            self.state.planner.stop()
        if self._threads:  # shutdown() waits for serve_forever, which a failed start never ran
            self._httpd.shutdown()
        self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=grace)

    def _sample(self) -> None:
        told = False
        while True:
            if not self.state.refresh() and not self.state.ready.is_set() and not told and self._on_first_failure:
                told = True
                self._on_first_failure(self.state.first_error)
            if self._stop.wait(self.state.interval_s):
                return

    def _plan(self) -> None:
        while not self.state.ready.is_set():
            if self._stop.wait(0.05):
                return
        while not self._stop.is_set():
            self.state.refresh_plan()
            if self._stop.wait(self.state.plan_interval_s):
                return


#: The names a browser on this machine reaches a loopback listener by.
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    """The Host headers a plain-HTTP view answers: its bound address and the loopback names, with the port.

    Without TLS the view listens on loopback only (`fgpuctl ui` refuses otherwise), but a web page
    the browser has open can still resolve its own domain name to 127.0.0.1 (DNS rebinding) and read
    /cluster.json as "same origin": its requests carry that domain as Host, which this refuses.
    """
    bound = f"[{host}]" if ":" in host else host
    names = {bound, *_LOOPBACK_NAMES}
    with_port = {f"{name}:{port}" for name in names}
    # A browser leaves out the default port.
    return frozenset(with_port | (names if port == 80 else set()))


class _BoundedThreadingServer(ThreadingHTTPServer):
    """A thread per connection, but at most MAX_CONNECTIONS of them (MAX_CONNECTIONS_PER_PEER per address)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._count_lock = threading.Lock()
        self._open = 0
        self._per_peer: collections.Counter[str] = collections.Counter()

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        peer = _peer_host(client_address)
        with self._count_lock:
            full = self._open >= MAX_CONNECTIONS or self._per_peer[peer] >= MAX_CONNECTIONS_PER_PEER
            if not full:
                self._open += 1
                self._per_peer[peer] += 1
        if full:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread was started to give the slot back
            self._release(peer)
            raise

    def process_request_thread(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(_peer_host(client_address))

    def _release(self, peer: str) -> None:
        with self._count_lock:
            self._open -= 1
            self._per_peer[peer] -= 1
            if self._per_peer[peer] <= 0:
                del self._per_peer[peer]


def _peer_host(client_address: Any) -> str:
    return str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)


def _handler(state: ViewState, hosts: set[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "fgpuctl-ui"
        #: set on the connection before its first read, so the TLS handshake (done by that read) has it too
        timeout = IO_TIMEOUT_S

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            if hosts and (self.headers.get("Host") or "").lower() not in hosts:
                self._send(HTTPStatus.MISDIRECTED_REQUEST, "text/plain; charset=utf-8",
                           b"misdirected request: this view answers only to its own address, such as localhost\n")
                return
            url = urlsplit(self.path)
            if url.path not in ("/", "/cluster.json"):
                self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found: the view is at / and /cluster.json\n")
                return
            try:
                query = ui_model.parse_query(parse_qs(url.query))
            except ui_model.QueryError as exc:
                if url.path == "/":
                    self._send(HTTPStatus.BAD_REQUEST, "text/html; charset=utf-8", ui_render.error_page(str(exc)).encode())
                else:
                    self._send(HTTPStatus.BAD_REQUEST, "application/json", json.dumps({"error": str(exc)}).encode())
                return
            doc = ui_model.filtered(state.document(), query)
            if url.path == "/cluster.json":
                self._send(HTTPStatus.OK, "application/json", json.dumps(doc).encode())
            else:
                self._send(HTTPStatus.OK, "text/html; charset=utf-8", ui_render.page(doc).encode())

        def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: a view polled by browsers
            return

    return Handler
