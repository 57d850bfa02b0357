"""What GPUs this node has: NVML (and sysfs) read into `apis.devices.NodeDevices`.

Discovery reports facts only; health is the health tracker's business and is
overlaid later. A GPU that answers its UUID but fails afterwards with a
"GPU gone" error is still reported, marked unhealthy, so the scheduler sees
it disappear rather than silently shrink the node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agent import mig_discovery, nvmlapi
from agent.nvmlapi import NVML
from agent.pci_address import sysfs_bus_id
from agent.pcitopology import PciTopologySource
from apis.devices import GPUInfo, MIGInstance, NodeDevices, NVLinkPeer, Topology, model_label
from apis.mig import MIGPlacement

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Discovery:
    """A node's devices plus the NVML handles the usage and health loops reuse."""

    devices: NodeDevices
    #: GPU or MIG UUID -> NVML handle.
    handles: Mapping[str, Any] = field(default_factory=dict)
    #: MIG UUID -> UUID of its parent GPU.
    mig_parents: Mapping[str, str] = field(default_factory=dict)


def discover(nvml: NVML, *, node_name: str, topology: PciTopologySource) -> Discovery:
    """Reads every GPU. NVML must be initialised; library-level errors propagate."""
    driver = nvml.nvmlSystemGetDriverVersion()
    try:
        cuda = nvmlapi.cuda_version_text(nvml.nvmlSystemGetCudaDriverVersion_v2())
    except nvmlapi.NVMLError_NotSupported:
        cuda = ""
    handles: dict[str, Any] = {}
    mig_parents: dict[str, str] = {}
    gpus: list[GPUInfo] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
        except nvmlapi.GPU_GONE_ERRORS as err:
            # Without a UUID the GPU cannot be named in a report; it is left out until it answers.
            log.warning("GPU index %d does not answer (%s); leaving it out of the report", index, nvmlapi.error_text(err))
            continue
        handles[uuid] = handle
        try:
            gpu = _read_gpu(nvml, handle, index=index, uuid=uuid, topology=topology)
        except nvmlapi.GPU_GONE_ERRORS as err:
            reason = f"lost: {nvmlapi.error_text(err)}"
            log.warning("GPU %s (index %d) failed during discovery: %s", uuid, index, reason)
            gpu = GPUInfo(uuid=uuid, minor=index, index=index, model="", model_label="", memory_bytes=0,
                          healthy=False, health_reason=reason)
        for mig in gpu.mig_instances:
            mig_parents[mig.uuid] = uuid
        gpus.append(gpu)
    for mig_uuid, parent in mig_parents.items():
        parent_handle = handles[parent]
        gpu = next(g for g in gpus if g.uuid == parent)
        inst = next(m for m in gpu.mig_instances if m.uuid == mig_uuid)
        try:
            handles[mig_uuid] = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent_handle, inst.index)
        except nvmlapi.NVMLError as err:
            log.warning("MIG device %s: no handle (%s)", mig_uuid, nvmlapi.error_text(err))
    return Discovery(
        devices=NodeDevices(
            node_name=node_name, gpus=tuple(_with_peer_uuids(gpus)), driver_version=driver, cuda_driver_version=cuda
        ),
        handles=handles,
        mig_parents=mig_parents,
    )


def _read_gpu(nvml: NVML, handle: Any, *, index: int, uuid: str, topology: PciTopologySource) -> GPUInfo:
    name = nvml.nvmlDeviceGetName(handle)
    bus_id = nvmlapi.text(nvml.nvmlDeviceGetPciInfo_v3(handle).busId)
    where = topology.locate(bus_id)
    mig_enabled = _mig_enabled(nvml, handle)
    try:
        minor = nvml.nvmlDeviceGetMinorNumber(handle)
    except nvmlapi.NVMLError_NotSupported:
        minor = index  # platforms without /dev/nvidiaN (WSL); the index is the best name left
    return GPUInfo(
        uuid=uuid,
        minor=minor,
        index=index,
        model=name,
        model_label=model_label(name),
        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        topology=Topology(
            numa_node=where.numa_node,
            socket_id=where.socket_id,
            pcie_root=where.pcie_root,
            bus_id=bus_id,
            nvlink_peers=_nvlink_peers(nvml, handle),
        ),
        mig_enabled=mig_enabled,
        mig_instances=_mig_instances(nvml, handle) if mig_enabled else (),
        power_limit_watts=_power_limit_watts(nvml, handle),
        mig_profiles=mig_discovery.read_profiles(nvml, handle),
    )


def _power_limit_watts(nvml: NVML, handle: Any) -> int:
    """The power management limit in watts; 0 where NVML has none (NotSupported on some boards)."""
    try:
        return int(nvml.nvmlDeviceGetPowerManagementLimit(handle)) // 1000  # NVML answers in milliwatts
    except nvmlapi.GPU_GONE_ERRORS:
        raise
    except nvmlapi.NVMLError as err:
        log.debug("power limit: %s", nvmlapi.error_text(err))
        return 0


def _nvlink_peers(nvml: NVML, handle: Any) -> tuple[NVLinkPeer, ...]:
    links: dict[str, int] = {}
    for link in range(nvmlapi.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvmlapi.NVML_FEATURE_ENABLED:
                continue
            remote = nvmlapi.text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except nvmlapi.NVMLError_NotSupported:
            if link == 0:
                return ()  # a PCIe-only board: no link is supported
            continue
        except nvmlapi.NVMLError_InvalidArgument:
            break  # past the device's last link
        except nvmlapi.GPU_GONE_ERRORS:
            raise
        except nvmlapi.NVMLError as err:
            log.debug("NVLink %d: %s", link, nvmlapi.error_text(err))
            continue
        links[remote] = links.get(remote, 0) + 1
    return tuple(NVLinkPeer(bus_id=bus, links=n) for bus, n in links.items())


def _with_peer_uuids(gpus: list[GPUInfo]) -> list[GPUInfo]:
    by_bus = {sysfs_bus_id(g.topology.bus_id): g.uuid for g in gpus if g.topology.bus_id}
    out = []
    for g in gpus:
        peers = tuple(replace(p, uuid=by_bus.get(sysfs_bus_id(p.bus_id), "")) for p in g.topology.nvlink_peers)
        out.append(replace(g, topology=replace(g.topology, nvlink_peers=peers)) if peers else g)
    return out


def _mig_enabled(nvml: NVML, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvmlapi.NVMLError_NotSupported:
        return False
    return bool(current == nvmlapi.NVML_DEVICE_MIG_ENABLE)


def _mig_instances(nvml: NVML, handle: Any) -> tuple[MIGInstance, ...]:
    instances = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvmlapi.NVMLError_NotFound:
            continue  # an empty slot
        except nvmlapi.NVMLError_InvalidArgument:
            break
        attrs = nvml.nvmlDeviceGetAttributes(mig)
        gi_id = nvml.nvmlDeviceGetGpuInstanceId(mig)
        profile_id, placement = mig_discovery.instance_placement(nvml, handle, gi_id) or (-1, MIGPlacement(-1, 0))
        instances.append(
            MIGInstance(
                uuid=nvml.nvmlDeviceGetUUID(mig),
                profile=mig_profile(nvml.nvmlDeviceGetName(mig), attrs),
                memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
                slices=int(attrs.gpuInstanceSliceCount),
                gpu_instance_id=gi_id,
                compute_instance_id=nvml.nvmlDeviceGetComputeInstanceId(mig),
                index=i,
                profile_id=profile_id,
                placement_start=placement.start,
                placement_size=placement.size,
            )
        )
    return tuple(instances)


def mig_profile(device_name: str, attrs: Any) -> str:
    """The profile ("1g.10gb") from the MIG device name NVML gives ("NVIDIA A100-SXM4-80GB MIG 1g.10gb").

    When the name carries none, it is rebuilt from the slice counts and memory
    the way NVIDIA names profiles.
    """
    _, sep, tail = device_name.rpartition(" MIG ")
    if sep and tail:
        return tail.strip()
    gi = int(attrs.gpuInstanceSliceCount)
    ci = int(attrs.computeInstanceSliceCount)
    gb = max(1, round(int(attrs.memorySizeMB) / 1024))
    prefix = f"{ci}c." if 0 < ci < gi else ""
    return f"{prefix}{gi}g.{gb}gb"
