"""`GET /metrics` for Prometheus on a bounded server: the agent's and the descheduler's metrics port.

prometheus_client's `start_http_server` gives every connection a thread that reads with no
deadline. The agent's port is on every node's address (hostNetwork) and the descheduler's on the
pod network, reachable by any pod, and the agent shares its process with the GPU hook: a pod that
opens connections and never finishes a request must not cost either a thread. So the exposition
(`prometheus_client.generate_latest`, the same text format) is served by `apis.httpserver`, whose
loop holds every waiting connection without a thread and bounds what one address may hold.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from apis.httpserver import SCRAPE_LIMITS, BoundedHTTPServer, Limits, ServesHTTP

METRICS_LIMITS = SCRAPE_LIMITS


def answer(registry: CollectorRegistry, method: str, path: str) -> tuple[int, str, bytes]:
    """The exposition for a GET of any path, as prometheus_client's server answers; 405 otherwise."""
    if method != "GET":
        return 405, "text/plain", f"{method} {path.split('?', 1)[0]}: use GET".encode()
    return 200, CONTENT_TYPE_LATEST, generate_latest(registry)


class MetricsServer(ServesHTTP):
    """`registry`'s exposition on `host:port` (port 0: any free one; an empty host: every interface)."""

    def __init__(self, registry: CollectorRegistry, *, host: str, port: int, name: str, limits: Limits = METRICS_LIMITS) -> None:
        self._http = BoundedHTTPServer(
            lambda method, path, _body: answer(registry, method, path),
            host=host or "0.0.0.0",
            port=port,
            name=name,
            limits=limits,
        )
