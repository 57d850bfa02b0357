"""Per-GPU and per-pod gauges follow the latest cycle; series of what is gone disappear."""

from __future__ import annotations

from agent.metrics import AgentMetrics
from agent.usage import GPUUsage, ProcessUsage


def _sample(metrics: AgentMetrics, name: str, labels: dict[str, str]) -> float | None:
    value = metrics.registry.get_sample_value(name, labels)
    return None if value is None else float(value)


def test_pod_gauges_sum_the_pods_processes_per_gpu() -> None:
    metrics = AgentMetrics()
    metrics.observe_usage(
        [GPUUsage(uuid="GPU-1", processes=(ProcessUsage(1, "pod-a", "c", 100), ProcessUsage(2, "pod-a", "c", 50)))]
    )
    labels = {"pod_uid": "pod-a", "uuid": "GPU-1"}
    assert _sample(metrics, "fgpu_agent_pod_gpu_memory_used_bytes", labels) == 150
    assert _sample(metrics, "fgpu_agent_pod_gpu_processes", labels) == 2


def test_a_pod_that_left_the_gpu_loses_its_series() -> None:
    metrics = AgentMetrics()
    metrics.observe_usage([GPUUsage(uuid="GPU-1", processes=(ProcessUsage(1, "pod-a", "c", 100),))])
    metrics.observe_usage([GPUUsage(uuid="GPU-1", processes=(ProcessUsage(2, "pod-b", "c", 10),))])
    assert _sample(metrics, "fgpu_agent_pod_gpu_memory_used_bytes", {"pod_uid": "pod-a", "uuid": "GPU-1"}) is None
    assert _sample(metrics, "fgpu_agent_pod_gpu_memory_used_bytes", {"pod_uid": "pod-b", "uuid": "GPU-1"}) == 10


def test_processes_outside_pods_count_for_the_gpu_but_make_no_pod_series() -> None:
    metrics = AgentMetrics()
    metrics.observe_usage([GPUUsage(uuid="GPU-1", memory_used_bytes=7, processes=(ProcessUsage(1, "", "", 7),))])
    assert _sample(metrics, "fgpu_agent_gpu_memory_used_bytes", {"uuid": "GPU-1"}) == 7
    assert b"fgpu_agent_pod_gpu_processes{" not in metrics.exposition()
