"""The metric names fgpu's daemons export, scraped from their real exposition.

Each daemon's metrics object is built as the daemon builds it and served over HTTP by the
same prometheus_client server the agent and the proxy start (`start_http_server` with their
registry); the scheduler's listener serves `Metrics.exposition()`, read here directly. Names
come from the `# TYPE` lines, so a labelled metric with no series yet still counts, and a
histogram `x` exports `x_bucket`, `x_sum` and `x_count`.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from agent.metrics import AgentMetrics
from runtimeproxy.metrics import ProxyMetrics
from scheduler_plugin.metrics import Metrics

_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}


def names_in_exposition(text: str) -> set[str]:
    names: set[str] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[:2] == ["#", "TYPE"]:
            names.update(parts[2] + suffix for suffix in _SUFFIXES.get(parts[3], ("",)))
    return names


@contextmanager
def _served(registry: CollectorRegistry) -> Iterator[str]:
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        # shutdown() waits out serve_forever's 0.5 s poll; off this thread, servers stop together
        threading.Thread(target=_stop, args=(server, thread), daemon=True).start()


def _stop(server: Any, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join(5)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def exported_by_daemon() -> dict[str, set[str]]:
    """daemon -> the metric names it exports."""
    with _served(AgentMetrics().registry) as agent, _served(ProxyMetrics().registry) as proxy:
        agent_text, proxy_text = _scrape(agent), _scrape(proxy)
    return {
        "fgpu-scheduler": names_in_exposition(Metrics().exposition().decode()),
        "fgpu-agent": names_in_exposition(agent_text),
        "fgpu-runtime-proxy": names_in_exposition(proxy_text),
    }


#: Metrics the dashboard and the alerts read that no daemon exports yet, with what each should be.
#: The test fails once a daemon exports one, so this list only shrinks.
AWAITED: dict[str, str] = {}
