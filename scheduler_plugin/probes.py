"""`GET /healthz`, `/readyz` and `/metrics`: what kubelet's probes and Prometheus read.

They are served beside the extender's verbs and, on their own, on the
`metricsListen` address. That listener may face the pod network without TLS
(kubelet probes the pod's IP, Prometheus scrapes from another pod) because
nothing on it changes state or reveals a secret: health is a word, and the
metrics carry counts, durations, node and model names, never a signature or an
annotation.

Liveness must not depend on who else is connected: `/healthz` and `/readyz`
are answered on the HTTP loop thread itself (`quick_answer`: two flags, no
lock, no I/O), never queued behind `/metrics` scrapes for a worker, and the
loop writes every answer as the client reads it, so scrapers that read slowly
hold no worker. One address may hold at most 8 connections.
"""

from __future__ import annotations

from apis.httpserver import SCRAPE_LIMITS, BoundedHTTPServer, ServesHTTP
from scheduler_plugin.scheduling import SchedulingService

PROBE_LIMITS = SCRAPE_LIMITS


def answer(service: SchedulingService, method: str, path: str) -> tuple[int, str, bytes] | None:
    """The answer for a probe or metrics path; None when `path` is none of them."""
    verb = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if verb not in ("healthz", "readyz", "metrics"):
        return None
    if method != "GET":
        return 405, "text/plain", f"{verb}: use GET".encode()
    if verb == "healthz":  # liveness: the state is loaded
        ok = service.ready
        return (200 if ok else 503), "text/plain", b"ok" if ok else b"loading"
    if verb == "readyz":  # readiness of the extender: route its calls to the leader only
        if not service.ready:
            return 503, "text/plain", b"loading"
        return (200, "text/plain", b"ok") if service.leading else (503, "text/plain", b"standby")
    return 200, "text/plain; version=0.0.4", service.metrics.exposition()


def quick_answer(service: SchedulingService, method: str, path: str) -> tuple[int, str, bytes] | None:
    """The answer for /healthz or /readyz, None for any other path. It reads two flags and takes no lock,
    so the HTTP loop gives it on its own thread (`BoundedHTTPServer(inline=...)`)."""
    verb = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if verb not in ("healthz", "readyz"):
        return None
    return answer(service, method, path)


class ProbeServer(ServesHTTP):
    """/healthz, /readyz and /metrics alone on `HOST:PORT` (an empty host means loopback)."""

    def __init__(self, service: SchedulingService, *, host: str, port: int) -> None:
        def handle(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
            found = answer(service, method, path)
            if found is None:
                return 404, "text/plain", f"unknown path {path}; use /healthz, /readyz or /metrics".encode()
            return found

        self._http = BoundedHTTPServer(
            handle,
            host=host or "127.0.0.1",
            port=port,
            name="fgpu-probes",
            limits=PROBE_LIMITS,
            inline=lambda method, path: quick_answer(service, method, path),
        )
