"""Read-only views of a node's GPUs and the pods on them (for fgpuctl inspect and GetNodeState)."""

from __future__ import annotations

from apis.allocation import share_memory_bytes
from scheduler_plugin.core.api import GPUView, NodeView, PodShareView
from scheduler_plugin.core.records import NodeRecord


def node_view(record: NodeRecord) -> NodeView:
    per_gpu: list[list[PodShareView]] = [[] for _ in record.gpus]
    for pod in sorted(record.pods.values(), key=lambda p: p.request.key):
        if pod.allocation is None:
            continue
        for share in pod.allocation.gpus:
            slot = record.share_slot(share)
            if slot is None:
                continue
            per_gpu[slot].append(
                PodShareView(
                    uid=pod.request.uid,
                    namespace=pod.request.namespace,
                    name=pod.request.name,
                    core_percent=share.core_percent,
                    memory_bytes=share_memory_bytes(share, gpu_memory_bytes=record.gpus[slot].memory_bytes),
                    assumed=pod.assumed,
                )
            )
    gpus = tuple(
        GPUView(
            device=gpu,
            allocated_core_percent=sum(p.core_percent for p in per_gpu[slot]),
            allocated_memory_bytes=sum(p.memory_bytes for p in per_gpu[slot]),
            pods=tuple(per_gpu[slot]),
            held_externally=gpu.uuid in record.external,
        )
        for slot, gpu in enumerate(record.gpus)
    )
    devices = record.devices
    return NodeView(
        name=record.name,
        gpus=gpus,
        driver_version=devices.driver_version if devices else "",
        discovery_error=devices.discovery_error if devices else "",
    )
