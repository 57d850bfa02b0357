"""Call metrics: what a scrape shows after calls were recorded."""

from __future__ import annotations

import pytest

from runtimeproxy.metrics import ProxyMetrics


def test_calls_are_counted_by_method_and_status_name() -> None:
    m = ProxyMetrics()
    for code in (0, 0, 5):
        m.record_call("RuntimeService/Version", code, 0.001)
    get = m.registry.get_sample_value
    assert get("fgpu_runtime_proxy_calls_total", {"method": "RuntimeService/Version", "code": "OK"}) == 2
    assert get("fgpu_runtime_proxy_calls_total", {"method": "RuntimeService/Version", "code": "NOT FOUND"}) == 1


def test_latency_lands_in_the_first_bucket_whose_bound_it_does_not_exceed() -> None:
    m = ProxyMetrics()
    for seconds in (0.0001, 0.0005, 0.0007, 100.0):
        m.record_call("ImageService/ListImages", 0, seconds)
    name = "fgpu_runtime_proxy_call_duration_seconds"

    def bucket(le: str) -> float | None:
        return m.registry.get_sample_value(name + "_bucket", {"method": "ImageService/ListImages", "le": le})

    assert bucket("0.0002") == 1
    assert bucket("0.0005") == 2
    assert bucket("0.001") == 3
    assert bucket("60.0") == 3
    assert bucket("+Inf") == 4
    assert m.registry.get_sample_value(name + "_count", {"method": "ImageService/ListImages"}) == 4
    assert m.registry.get_sample_value(name + "_sum", {"method": "ImageService/ListImages"}) == pytest.approx(100.0013)
