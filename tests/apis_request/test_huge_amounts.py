"""Amounts beyond any node are refused when the pod is read, never carried into the scheduler's 64-bit sums."""

from __future__ import annotations

import pytest

from apis.request import MOST, RequestError, parse_pod, pod_cpu_memory


def _pod(**resources: str) -> dict[str, object]:
    return {"metadata": {"name": "big", "namespace": "ml", "uid": "u-1"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": resources}}]}}


@pytest.mark.parametrize("resources", [
    {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "100000000Ei"},
    {"nvidia.com/gpu": "9223372036854775808"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100000000000000000"},
])
def test_a_gpu_amount_beyond_any_node_is_refused_naming_the_field(resources: dict[str, str]) -> None:
    with pytest.raises(RequestError) as refused:
        parse_pod(_pod(**resources))
    assert any("is larger than any node has" in e and 'container "main"' in e for e in refused.value.errors)


@pytest.mark.parametrize(("resource", "value"), [("cpu", "1e18"), ("memory", "1e30"), ("memory", "2Ei")])
def test_cpu_or_memory_beyond_any_node_is_refused(resource: str, value: str) -> None:
    with pytest.raises(RequestError, match=f"{resource}={value}: is larger than any node has"):
        pod_cpu_memory(_pod(**{resource: value}))


def test_the_bound_itself_and_big_real_amounts_are_read() -> None:
    assert pod_cpu_memory(_pod(cpu="1024", memory="1Pi")) == (1024_000, MOST)
    request = parse_pod(_pod(**{"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory": "141Gi"}))
    assert request is not None and request.memory_bytes == 141 * 2**30
