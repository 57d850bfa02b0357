"""A GPU that leaves the report takes every one of its series with it, usage and pods' included."""

from __future__ import annotations

from agent.metrics import AgentMetrics
from agent.usage import GPUUsage, ProcessUsage
from apis.devices import GPUInfo, MIGInstance, NodeDevices


def _gpu(uuid: str, minor: int, *migs: str) -> GPUInfo:
    return GPUInfo(
        uuid=uuid, minor=minor, index=minor, model="NVIDIA A100", model_label="A100", memory_bytes=80 << 30,
        mig_enabled=bool(migs),
        mig_instances=tuple(MIGInstance(uuid=m, profile="1g.10gb", memory_bytes=10 << 30, slices=1) for m in migs),
    )


def _series(metrics: AgentMetrics) -> list[str]:
    return [line for line in metrics.exposition().decode().splitlines() if "GPU-" in line and not line.startswith("#")]


def test_series_of_a_gpu_no_longer_reported_are_removed_and_the_others_kept() -> None:
    metrics = AgentMetrics()
    metrics.observe_devices(NodeDevices(node_name="n", gpus=(_gpu("GPU-a", 0, "MIG-a1"), _gpu("GPU-b", 1))))
    metrics.observe_usage([
        GPUUsage(uuid="GPU-a", memory_used_bytes=1, processes=(ProcessUsage(1, "pod-1", "c", 1),)),
        GPUUsage(uuid="MIG-a1", memory_used_bytes=1, processes=(ProcessUsage(1, "pod-1", "c", 1),)),
        GPUUsage(uuid="GPU-b", memory_used_bytes=2, sm_utilization_percent=40,
                 processes=(ProcessUsage(2, "pod-2", "c", 2),)),
    ])
    assert any('uuid="GPU-b"' in line for line in _series(metrics))
    metrics.observe_devices(NodeDevices(node_name="n", gpus=(_gpu("GPU-a", 0, "MIG-a1"),)))
    left = _series(metrics)
    assert left and not [line for line in left if "GPU-b" in line]
    assert metrics.registry.get_sample_value("fgpu_agent_gpu_memory_used_bytes", {"uuid": "MIG-a1"}) == 1
    assert metrics.registry.get_sample_value(
        "fgpu_agent_pod_gpu_memory_used_bytes", {"pod_uid": "pod-1", "uuid": "GPU-a"}
    ) == 1


def test_a_report_without_gpus_leaves_no_per_gpu_series() -> None:
    metrics = AgentMetrics()
    metrics.observe_devices(NodeDevices(node_name="n", gpus=(_gpu("GPU-a", 0),)))
    metrics.observe_usage([GPUUsage(uuid="GPU-a", memory_used_bytes=1, sm_utilization_percent=9)])
    metrics.observe_devices(NodeDevices(node_name="n", discovery_error="NVML init failed"))
    assert _series(metrics) == []
    assert metrics.registry.get_sample_value("fgpu_agent_nvml_up") == 0
    # The GPU coming back brings its series back with the next cycle.
    metrics.observe_devices(NodeDevices(node_name="n", gpus=(_gpu("GPU-a", 0),)))
    metrics.observe_usage([GPUUsage(uuid="GPU-a", memory_used_bytes=3)])
    assert metrics.registry.get_sample_value("fgpu_agent_gpu_memory_used_bytes", {"uuid": "GPU-a"}) == 3
