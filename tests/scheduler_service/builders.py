"""Hand-built nodes and pods for the scheduler service tests."""

from __future__ import annotations

import uuid as uuid_mod
from typing import Any

from apis import names
from apis.devices import GPUInfo, NodeDevices, NVLinkPeer, Topology

GiB = 1024**3


def gpu_node(
    name: str,
    *,
    gpus: int = 8,
    model: str = "NVIDIA H100 80GB HBM3",
    label: str = "H100-80GB-HBM3",
    memory_gib: int = 80,
    nvlink: bool = True,
    unhealthy: tuple[int, ...] = (),
) -> NodeDevices:
    bus = [f"00000000:{0x18 + 0x10 * i:02X}:00.0" for i in range(gpus)]
    uuids = [f"GPU-{name}-{i:02d}" for i in range(gpus)]
    out = []
    for i in range(gpus):
        peers = tuple(NVLinkPeer(bus_id=bus[j], uuid=uuids[j], links=18) for j in range(gpus) if j != i) if nvlink else ()
        out.append(
            GPUInfo(
                uuid=uuids[i],
                minor=i,
                index=i,
                model=model,
                model_label=label,
                memory_bytes=memory_gib * GiB,
                healthy=i not in unhealthy,
                health_reason="Xid79" if i in unhealthy else "",
                topology=Topology(numa_node=i * 2 // max(gpus, 1), socket_id=i * 2 // max(gpus, 1), pcie_root=f"pci0000:{i // 2:02x}", bus_id=bus[i], nvlink_peers=peers),
            )
        )
    return NodeDevices(node_name=name, gpus=tuple(out), driver_version="550.54.15", cuda_driver_version="12.4")


def t4_node(name: str, *, gpus: int = 4) -> NodeDevices:
    return gpu_node(name, gpus=gpus, model="Tesla T4", label="T4", memory_gib=16, nvlink=False)


def pod(
    name: str,
    *,
    namespace: str = "default",
    uid: str | None = None,
    requests: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    scheduler_name: str | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": dict(requests or {}), "limits": dict(requests or {})}}],
    }
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid_mod.uuid4()),
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def share_pod(name: str, *, core: int = 50, memory: str = "10Gi", **kw: Any) -> dict[str, Any]:
    return pod(name, requests={names.GPU_CORE: str(core), names.GPU_MEMORY: memory}, **kw)


def whole_pod(name: str, *, gpus: int = 1, **kw: Any) -> dict[str, Any]:
    return pod(name, requests={names.NVIDIA_GPU: str(gpus)}, **kw)
