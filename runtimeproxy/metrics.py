"""Prometheus metrics of the proxy.

| metric | labels | what |
| --- | --- | --- |
| `fgpu_runtime_proxy_calls_total` | method, code | CRI calls finished, by gRPC status name |
| `fgpu_runtime_proxy_call_duration_seconds` | method | time from request headers to final status |
| `fgpu_runtime_proxy_hook_calls_total` | server, stage | hook calls made |
| `fgpu_runtime_proxy_hook_errors_total` | server, stage, reason | hook calls that failed (unavailable, timeout, rejected, ...) |
| `fgpu_runtime_proxy_hook_duration_seconds` | server, stage | hook call latency |
| `fgpu_runtime_proxy_edits_applied_total` | kind | edits applied to requests (env, mount, device, cdi, annotation, resources) |
| `fgpu_runtime_proxy_forced_void_total` | | containers given NVIDIA_VISIBLE_DEVICES=void |
| `fgpu_runtime_proxy_refused_total` | method, reason | calls the proxy answered itself |
| `fgpu_runtime_proxy_backend_dials_total` | result | connections opened to the runtime (ok, failed) |
"""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0)

_CODE_NAMES = {int(c.value[0]): str(c.value[1]).upper() for c in grpc.StatusCode}


def code_name(code: int) -> str:
    return _CODE_NAMES.get(code, str(code))


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.calls = Counter("fgpu_runtime_proxy_calls_total", "CRI calls finished", ["method", "code"], registry=r)
        self.call_duration = Histogram(
            "fgpu_runtime_proxy_call_duration_seconds", "CRI call latency through the proxy", ["method"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.hook_calls = Counter("fgpu_runtime_proxy_hook_calls_total", "Hook calls", ["server", "stage"], registry=r)
        self.hook_errors = Counter(
            "fgpu_runtime_proxy_hook_errors_total", "Failed hook calls", ["server", "stage", "reason"], registry=r
        )
        self.hook_duration = Histogram(
            "fgpu_runtime_proxy_hook_duration_seconds", "Hook call latency", ["server", "stage"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.edits = Counter("fgpu_runtime_proxy_edits_applied_total", "Edits applied to requests", ["kind"], registry=r)
        self.forced_void = Counter(
            "fgpu_runtime_proxy_forced_void_total", "Containers given NVIDIA_VISIBLE_DEVICES=void", registry=r
        )
        self.refused = Counter(
            "fgpu_runtime_proxy_refused_total", "Calls the proxy answered itself", ["method", "reason"], registry=r
        )
        self.backend_dials = Counter(
            "fgpu_runtime_proxy_backend_dials_total", "Connections opened to the runtime", ["result"], registry=r
        )
        # The per-call path runs for every pass-through call: resolve label children once.
        self._call_children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}

    def record_call(self, method: str, code: int, seconds: float) -> None:
        key = (method, code)
        children = self._call_children.get(key)
        if children is None:
            children = (self.calls.labels(method, code_name(code)), self.call_duration.labels(method))
            self._call_children[key] = children
        children[0].inc()
        children[1].observe(seconds)
