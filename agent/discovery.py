"""What GPUs this node has: NVML (and sysfs) read into `apis.devices.NodeDevices`.

Discovery reports facts only; health is the health tracker's business and is
overlaid later. An NVML error on one GPU stays that GPU's: one that answers its
UUID but fails a later call (lost, or a query it does not support) is still
reported, marked unhealthy with the error and the fix, so the scheduler sees
it disappear rather than silently shrink the node, and the other GPUs are
reported as usual. Only library-level errors fail the whole discovery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from agent import mig_discovery, nvmlapi
from agent.nvmlapi import NVML
from agent.pci_address import sysfs_bus_id
from agent.pcitopology import PciLocation, PciTopologySource
from apis.devices import GPUInfo, MIGInstance, NodeDevices, NVLinkPeer, Topology, model_label
from apis.mig import MIGPlacement

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: nvml.h's codes for NVML itself no longer answering (uninitialised, driver unloaded or replaced
#: under the agent). One of them on a per-GPU call is the node's error, not the GPU's: it
#: fails the discovery, and the poll loop starts NVML over.
_LIBRARY_ERROR_CODES = frozenset({
    1,  # NVML_ERROR_UNINITIALIZED
    9,  # NVML_ERROR_DRIVER_NOT_LOADED
    18,  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
})


@dataclass(frozen=True)
class Discovery:
    """A node's devices plus the NVML handles the usage and health loops reuse."""

    devices: NodeDevices
    #: GPU or MIG UUID -> NVML handle.
    handles: Mapping[str, Any] = field(default_factory=dict)
    #: MIG UUID -> UUID of its parent GPU.
    mig_parents: Mapping[str, str] = field(default_factory=dict)


def discover(
    nvml: NVML, *, node_name: str, topology: PciTopologySource, known: Mapping[str, GPUInfo] | None = None
) -> Discovery:
    """Reads every GPU. NVML must be initialised; library-level errors propagate.

    An NVML error on one GPU is that GPU's problem, not the node's: the GPU is reported
    unhealthy with the error and the fix, the others as usual. `known` holds the facts of
    GPUs seen at earlier discoveries (by UUID); a GPU that answers its UUID but no longer its
    other calls is reported with those facts, so its minor and memory stay right.
    """
    driver = nvml.nvmlSystemGetDriverVersion()
    try:
        cuda = nvmlapi.cuda_version_text(nvml.nvmlSystemGetCudaDriverVersion_v2())
    except nvmlapi.NVMLError_NotSupported:
        cuda = ""
    known = known or {}
    handles: dict[str, Any] = {}
    mig_parents: dict[str, str] = {}
    read: list[GPUInfo] = []
    failed: list[tuple[GPUInfo, bool]] = []  # (the GPU, whether its minor is only the index guessed)
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
        except nvmlapi.NVMLError as err:
            if _library_level(err):
                raise
            # Without a UUID the GPU cannot be named in a report; it is left out until it answers.
            # One seen before stays reported (unhealthy) through NodeState's vanished GPUs.
            log.warning("GPU index %d does not answer NVML (%s); leaving it out of the report: %s",
                        index, nvmlapi.error_text(err), _fix(err, index=index, minor=None))
            continue
        handles[uuid] = handle
        try:
            gpu = _read_gpu(nvml, handle, index=index, uuid=uuid, topology=topology)
        except nvmlapi.NVMLError as err:
            if _library_level(err):
                raise
            gpu, guessed = _unreadable_gpu(nvml, handle, index=index, uuid=uuid, topology=topology,
                                           known=known.get(uuid), err=err)
            log.warning("GPU %s (index %d, /dev/nvidia%d) failed during discovery; reporting it unhealthy: %s",
                        uuid, index, gpu.minor, gpu.health_reason)
            failed.append((gpu, guessed))
            continue
        for mig in gpu.mig_instances:
            if mig.uuid:  # an empty GPU instance has no MIG device to open
                mig_parents[mig.uuid] = uuid
        read.append(gpu)
    for mig_uuid, parent in mig_parents.items():
        parent_handle = handles[parent]
        gpu = next(g for g in read if g.uuid == parent)
        inst = next(m for m in gpu.mig_instances if m.uuid == mig_uuid)
        try:
            handles[mig_uuid] = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent_handle, inst.index)
        except nvmlapi.NVMLError as err:
            log.warning("MIG device %s: no handle (%s)", mig_uuid, nvmlapi.error_text(err))
    gpus = sorted([*read, *_with_unique_minors(read, failed)], key=lambda g: g.index)
    reported = {g.uuid for g in gpus}
    return Discovery(
        devices=NodeDevices(
            node_name=node_name, gpus=tuple(_with_peer_uuids(gpus)), driver_version=driver, cuda_driver_version=cuda
        ),
        handles={u: h for u, h in handles.items() if u in mig_parents or u in reported},
        mig_parents=mig_parents,
    )


def _unreadable_gpu(
    nvml: NVML, handle: Any, *, index: int, uuid: str, topology: PciTopologySource, known: GPUInfo | None,
    err: BaseException,
) -> tuple[GPUInfo, bool]:
    """A GPU whose UUID answered but a later call failed, with the facts still to be had.

    Facts from an earlier discovery win: a lost GPU answers nothing more, and its minor
    (the N of /dev/nvidiaN in the Device object) must not turn into its index.
    """
    if known is not None:
        reason = _reason(err, index=index, minor=known.minor)
        return replace(known, index=index, healthy=False, health_reason=reason), False
    minor = _answer(lambda: int(nvml.nvmlDeviceGetMinorNumber(handle)))
    name = _answer(lambda: str(nvml.nvmlDeviceGetName(handle))) or ""
    bus_id = _answer(lambda: nvmlapi.text(nvml.nvmlDeviceGetPciInfo_v3(handle).busId)) or ""
    memory = _answer(lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).total)) or 0
    where = topology.locate(bus_id) if bus_id else PciLocation()
    gpu = GPUInfo(
        uuid=uuid, minor=index if minor is None else minor, index=index, model=name, model_label=model_label(name),
        memory_bytes=memory,
        topology=Topology(numa_node=where.numa_node, socket_id=where.socket_id, pcie_root=where.pcie_root, bus_id=bus_id),
        healthy=False, health_reason=_reason(err, index=index, minor=minor),
    )
    return gpu, minor is None


def _library_level(err: BaseException) -> bool:
    return getattr(err, "value", None) in _LIBRARY_ERROR_CODES


def _answer(call: Callable[[], _T]) -> _T | None:
    try:
        return call()
    except nvmlapi.NVMLError:
        return None


def _with_unique_minors(read: list[GPUInfo], failed: list[tuple[GPUInfo, bool]]) -> list[GPUInfo]:
    """The failed GPUs that can be reported without a second GPU on one minor.

    Two GPUs on one /dev/nvidiaN would make the Device object point a pod at the wrong card,
    so a failed GPU yields its minor to a GPU read just now, and a minor only guessed (the
    index, when NVML gave none) yields to one NVML gave, now or at an earlier discovery.
    """
    taken = {g.minor for g in read}
    out = []
    for gpu, _guessed in sorted(failed, key=lambda f: f[1]):
        if gpu.minor in taken:
            log.warning("GPU %s (index %d): /dev/nvidia%d is another GPU's; leaving it out of the report (%s)",
                        gpu.uuid, gpu.index, gpu.minor, gpu.health_reason)
            continue
        taken.add(gpu.minor)
        out.append(gpu)
    return out


def _reason(err: BaseException, *, index: int, minor: int | None) -> str:
    """The health reason of a GPU discovery could not read: what failed, then what to do.

    "lost" and "unreadable" lead, as the metrics' reason label takes the text before the first colon.
    """
    if isinstance(err, nvmlapi.GPU_GONE_ERRORS):
        return f"lost: {nvmlapi.error_text(err)}"
    return f"unreadable: {nvmlapi.error_text(err)} (GPU index {index}); {_fix(err, index=index, minor=minor)}"


def _fix(err: BaseException, *, index: int, minor: int | None) -> str:
    device = f"/dev/nvidia{minor}" if minor is not None else "its /dev/nvidiaN"
    if isinstance(err, nvmlapi.GPU_GONE_ERRORS):
        return f"check the GPU with `nvidia-smi -i {index}` and the kernel log (Xid); it may need a reset"
    if isinstance(err, nvmlapi.NVMLError_NoPermission):
        return f"give the agent access to {device} (device cgroup, or run it privileged) and restart it"
    if isinstance(err, nvmlapi.NVMLError_NotSupported):
        return ("the GPU does not answer a query fgpu needs (unified-memory boards have no dedicated memory "
                "to share); fgpu does not hand it to pods")
    return f"check the GPU with `nvidia-smi -i {index} -q`; fgpu does not hand it to pods until it answers"


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
    """The GPU's MIG devices, then its GPU instances without one (uuid "": taken, but nothing to run on).

    An empty GPU instance (`nvidia-smi mig -cgi` without `-C`, or a create left half-made) has no
    MIG device, yet NVML refuses every create that overlaps its memory slices; unreported, the
    scheduler would choose such a placement again and again.
    """
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
    return (*instances, *_empty_gpu_instances(nvml, handle, {m.gpu_instance_id for m in instances}))


def _empty_gpu_instances(nvml: NVML, handle: Any, with_device: set[int]) -> list[MIGInstance]:
    empty = [gi for gi in mig_discovery.gpu_instances(nvml, handle) if gi[0] not in with_device]
    if not empty:
        return []
    profiles = {p.profile_id: p for p in mig_discovery.read_profiles(nvml, handle)}
    out = []
    for gi_id, profile_id, placement in empty:
        profile = profiles.get(profile_id)
        out.append(
            MIGInstance(
                uuid="",
                profile=profile.name if profile else str(profile_id),
                memory_bytes=profile.memory_bytes if profile else 0,
                slices=profile.slices if profile else 0,
                gpu_instance_id=gi_id,
                compute_instance_id=-1,
                index=-1,
                profile_id=profile_id,
                placement_start=placement.start,
                placement_size=placement.size,
            )
        )
    return out


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
