"""Hand-built nodes and pods for the core's tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from apis.devices import ExternalHolder, GPUInfo, MIGInstance, NodeDevices, NVLinkPeer, Topology
from apis.request import DeviceRequest
from scheduler_plugin.core.api import LabelRequirement, NodeInfo, NodeName, PodRequest, PodUID

GiB = 2**30


def gpu(
    node: str,
    index: int,
    *,
    model: str = "A100-SXM4-80GB",
    memory_gib: int = 80,
    healthy: bool = True,
    health_reason: str = "",
    numa: int = -1,
    pcie_root: str = "",
    nvlink_to: Sequence[int] = (),
    mig: Sequence[tuple[str, int]] = (),
) -> GPUInfo:
    """One GPU; `nvlink_to` lists the indexes of its NVLink peers, `mig` (profile, GiB) instances."""
    return GPUInfo(
        uuid=f"GPU-{node}-{index}",
        minor=index,
        index=index,
        model=f"NVIDIA {model}",
        model_label=model,
        memory_bytes=memory_gib * GiB,
        healthy=healthy,
        health_reason=health_reason,
        topology=Topology(
            numa_node=numa,
            pcie_root=pcie_root,
            bus_id=f"0000:{index:02x}:00.0",
            nvlink_peers=tuple(NVLinkPeer(bus_id=f"0000:{peer:02x}:00.0") for peer in nvlink_to),
        ),
        mig_enabled=bool(mig),
        mig_instances=tuple(
            MIGInstance(
                uuid=f"MIG-{node}-{index}-{i}",
                profile=profile,
                memory_bytes=gib * GiB,
                slices=int(profile[0]),
                index=i,
            )
            for i, (profile, gib) in enumerate(mig)
        ),
    )


def node(
    name: str,
    count: int = 8,
    *,
    model: str = "A100-SXM4-80GB",
    memory_gib: int = 80,
    unhealthy: Sequence[int] = (),
    external: Sequence[int] = (),
    gpus: Sequence[GPUInfo] | None = None,
    discovery_error: str = "",
) -> NodeDevices:
    """A node of `count` identical GPUs (or the given ones)."""
    if gpus is None:
        gpus = [
            gpu(
                name,
                i,
                model=model,
                memory_gib=memory_gib,
                healthy=i not in unhealthy,
                health_reason="XID 79" if i in unhealthy else "",
            )
            for i in range(count)
        ]
    return NodeDevices(
        node_name=name,
        gpus=tuple(gpus),
        driver_version="550.54.15",
        external_holders=tuple(
            ExternalHolder(gpu_uuid=f"GPU-{name}-{i}", resource_name="nvidia.com/gpu") for i in external
        ),
        discovery_error=discovery_error,
    )


def info(
    name: str, *, cpu: int = 64000, memory_gib: int = 512, labels: Mapping[str, str] | None = None
) -> NodeInfo:
    return NodeInfo(
        name=NodeName(name), labels=dict(labels or {}), cpu_milli=cpu, memory_bytes=memory_gib * GiB
    )


def share(core: int, *, gib: int | None = None, ratio: int | None = None, cards: int = 1) -> DeviceRequest:
    if gib is None and ratio is None:
        ratio = core
    return DeviceRequest(
        gpus=cards,
        core_percent=core,
        memory_bytes=None if gib is None else gib * GiB,
        memory_ratio_percent=ratio,
        whole=False,
        source="koordinator",
    )


def whole(cards: int) -> DeviceRequest:
    return DeviceRequest(
        gpus=cards, core_percent=100, memory_bytes=None, memory_ratio_percent=100, whole=True, source="nvidia"
    )


def pod(
    name: str,
    device: DeviceRequest | None = None,
    *,
    cpu: int = 0,
    memory_gib: int = 0,
    use: Sequence[str] = (),
    avoid: Sequence[str] = (),
    scope: str = "",
    job: str = "",
    selector: Mapping[str, str] | None = None,
    affinity: Sequence[Sequence[LabelRequirement]] = (),
) -> PodRequest:
    return PodRequest(
        uid=PodUID(f"uid-{name}"),
        namespace="default",
        name=name,
        device=device,
        cpu_milli=cpu,
        memory_bytes=memory_gib * GiB,
        model_use=frozenset(use),
        model_avoid=frozenset(avoid),
        topology_scope=scope,
        job_key=job,
        node_selector=dict(selector or {}),
        affinity_terms=tuple(tuple(term) for term in affinity),
    )
