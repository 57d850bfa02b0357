"""A stand-in for the `pynvml` module, driven by an inventory file.

It has the real function names, returns the real pynvml ctypes structures
where pynvml does (`nvmlPciInfo_t`, `c_nvmlMemory_t`, ...) and raises the real
`pynvml.NVMLError_*` classes: NotSupported for what the GPU cannot do,
GpuIsLost for a GPU that fell off the bus, Uninitialized before `nvmlInit`,
Timeout when an event wait ends empty. So the agent's NVML code path is the
production one; only the library underneath is replaced.

Besides the NVML names it has a few `set_*`/`inject_*` methods that tests and
the `--fake-nvml` mode use to change the machine while the agent runs, and, for
a script outside the agent process, a usage file (`USAGE_FILE_ENV`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pynvml

from agent.fakenvml_inventory import GPUSpec, Inventory, ProcessSpec
from agent.fakenvml_usage import USAGE_FILE_ENV, UsageFile
from agent.mig_fakenvml import FakeMIGCalls

_log = logging.getLogger(__name__)


#: NVML reports Xid 79 when a GPU has fallen off the bus; after it every call on the GPU fails.
XID_FALLEN_OFF_BUS = 79


@dataclass(frozen=True)
class FakeHandle:
    """What nvmlDeviceGetHandleBy* returns: a GPU, or a MIG device of one."""

    gpu_index: int
    mig_index: int = -1


@dataclass(frozen=True)
class FakeEventData:
    """Same fields as pynvml's c_nvmlEventData_t."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class FakeEventSet:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}


@dataclass
class _PendingEvent:
    gpu_index: int
    xid: int
    due: float


def _error(cls_name: str) -> Exception:
    cls: type[Exception] = getattr(pynvml, f"NVMLError_{cls_name}")
    return cls()


class FakeNVML(FakeMIGCalls):
    """The pynvml API over an inventory. Thread-safe, as libnvidia-ml is.

    The MIG management calls (GPU and compute instances, placements) are agent/mig_fakenvml.py's.
    """

    def __init__(
        self, inventory: Inventory, *, clock: Callable[[], float] = time.monotonic, usage_file: str | None = None
    ) -> None:
        self._clock = clock
        #: None: from USAGE_FILE_ENV ("" or unset: no usage file)
        self._usage_file = os.environ.get(USAGE_FILE_ENV, "") if usage_file is None else usage_file
        self._usage = UsageFile(self._usage_file)
        self._cond = threading.Condition()
        self._gpus: list[GPUSpec] = list(inventory.gpus)
        self._inventory = inventory
        self._init_count = 0
        self._init_error = inventory.init_error
        self._pending: list[_PendingEvent] = []
        self._sets: list[FakeEventSet] = []
        #: Calls made, by name; lets tests and the benchmark see what a cycle costs in NVML calls.
        self.calls: dict[str, int] = {}
        #: GPU index -> processes listed only by nvmlDeviceGetMPSComputeRunningProcesses (MPS clients)
        self._mps_processes: dict[int, tuple[ProcessSpec, ...]] = {}
        #: False: a driver without the MPS listing (its call raises FunctionNotFound)
        self.mps_listing = True
        self._init_mig()

    # --- controls for tests and --fake-nvml -----------------------------------------

    def set_init_error(self, name: str) -> None:
        """Makes later nvmlInit calls raise NVMLError_<name> ("" to succeed)."""
        with self._cond:
            self._init_error = name

    def set_lost(self, index: int, lost: bool) -> None:
        with self._cond:
            self._gpus[index] = replace(self._gpus[index], lost=lost)

    def set_usage(
        self,
        index: int,
        *,
        utilization_percent: int | None = None,
        memory_used_bytes: int | None = None,
        processes: tuple[ProcessSpec, ...] | None = None,
        mps_processes: tuple[ProcessSpec, ...] | None = None,
    ) -> None:
        """`mps_processes`: MPS clients, listed by nvmlDeviceGetMPSComputeRunningProcesses only."""
        with self._cond:
            if mps_processes is not None:
                self._mps_processes[index] = mps_processes
            g = self._gpus[index]
            self._gpus[index] = replace(
                g,
                utilization_percent=g.utilization_percent if utilization_percent is None else utilization_percent,
                memory_used_bytes=g.memory_used_bytes if memory_used_bytes is None else memory_used_bytes,
                processes=g.processes if processes is None else processes,
            )

    def inject_xid(self, index: int, xid: int, *, after_s: float = 0.0) -> None:
        """Queues an Xid critical-error event on GPU `index`."""
        with self._cond:
            self._pending.append(_PendingEvent(gpu_index=index, xid=xid, due=self._clock() + after_s))
            self._cond.notify_all()

    # --- pynvml: library ----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        with self._cond:
            if self._init_error:
                raise _error(self._init_error)
            if self._init_count == 0:
                now = self._clock()
                self._pending.extend(
                    _PendingEvent(gpu_index=e.gpu_index, xid=e.xid, due=now + e.after_s) for e in self._inventory.events
                )
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        with self._cond:
            self._require_init()
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._checked("nvmlSystemGetDriverVersion")
        return self._inventory.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._checked("nvmlSystemGetCudaDriverVersion")
        return self._inventory.cuda_driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._checked("nvmlSystemGetCudaDriverVersion_v2")
        return self._inventory.cuda_driver_version

    # --- pynvml: device handles ---------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._checked("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._checked("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._gpus):
            raise _error("InvalidArgument")
        if self._gpus[index].lost:
            raise _error("GpuIsLost")
        return FakeHandle(gpu_index=index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeHandle:
        self._checked("nvmlDeviceGetHandleByUUID")
        want = uuid.decode() if isinstance(uuid, bytes) else uuid
        for g in self._gpus:
            if g.uuid == want:
                if g.lost:
                    raise _error("GpuIsLost")
                return FakeHandle(gpu_index=g.index)
            for i, mig in enumerate(g.mig_instances):
                if mig.uuid == want and g.mig_enabled:
                    return FakeHandle(gpu_index=g.index, mig_index=i)
        raise _error("NotFound")

    # --- pynvml: device facts -----------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        g = self._gpu("nvmlDeviceGetUUID", handle)
        return g.mig_instances[handle.mig_index].uuid if handle.mig_index >= 0 else g.uuid

    def nvmlDeviceGetMinorNumber(self, handle: FakeHandle) -> int:
        g = self._gpu("nvmlDeviceGetMinorNumber", handle)
        if handle.mig_index >= 0:
            raise _error("NotSupported")
        return g.minor

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        g = self._gpu("nvmlDeviceGetName", handle)
        if handle.mig_index >= 0:
            return f"{g.name} MIG {g.mig_instances[handle.mig_index].profile}"
        return g.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        g = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        info = pynvml.c_nvmlMemory_t()
        if handle.mig_index >= 0:
            total = g.mig_instances[handle.mig_index].memory_bytes
            used = sum(
                p.used_memory_bytes
                for p in g.processes + self._mps_processes.get(handle.gpu_index, ())
                if p.gpu_instance_id == g.mig_instances[handle.mig_index].gpu_instance_id
            )
        else:
            total, used = g.memory_bytes, g.memory_used_bytes
        info.total, info.used, info.free = total, used, max(0, total - used)
        return info

    def nvmlDeviceGetPciInfo_v3(self, handle: FakeHandle) -> Any:
        g = self._gpu("nvmlDeviceGetPciInfo_v3", handle)
        return _pci_info(g.bus_id)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeHandle) -> int:
        g = self._gpu("nvmlDeviceGetPowerManagementLimit", handle)
        if g.power_limit_watts is None or handle.mig_index >= 0:
            raise _error("NotSupported")
        return g.power_limit_watts * 1000  # milliwatts, as NVML answers

    # --- pynvml: NVLink -----------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        g = self._gpu("nvmlDeviceGetNvLinkState", handle)
        remotes = _link_remotes(g)
        if not remotes:
            raise _error("NotSupported")
        if not 0 <= link < len(remotes):
            raise _error("InvalidArgument")  # as NVML answers for links past the device's last
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, handle: FakeHandle, link: int) -> Any:
        g = self._gpu("nvmlDeviceGetNvLinkRemotePciInfo_v2", handle)
        remotes = _link_remotes(g)
        if not remotes:
            raise _error("NotSupported")
        if not 0 <= link < len(remotes):
            raise _error("InvalidArgument")
        return _pci_info(remotes[link])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeHandle, link: int) -> Any:
        return self.nvmlDeviceGetNvLinkRemotePciInfo_v2(handle, link)

    # --- pynvml: MIG --------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        g = self._gpu("nvmlDeviceGetMigMode", handle)
        if g.mig_enabled is None or handle.mig_index >= 0:
            raise _error("NotSupported")
        def mode(enabled: bool | None) -> int:
            return int(pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE)

        with self._cond:  # [current, pending]: a set mode waits for a GPU reset (agent/mig_fakenvml.py)
            return [mode(g.mig_enabled), mode(self._mig_pending.get(g.index, g.mig_enabled))]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:
        g = self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle)
        if g.mig_enabled is None:
            raise _error("NotSupported")
        return g.mig_max_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeHandle, index: int) -> FakeHandle:
        g = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not g.mig_enabled:
            raise _error("NotSupported") if g.mig_enabled is None else _error("InvalidArgument")
        if not 0 <= index < g.mig_max_devices:
            raise _error("InvalidArgument")
        if index >= len(g.mig_instances):
            raise _error("NotFound")
        return FakeHandle(gpu_index=g.index, mig_index=index)

    def nvmlDeviceIsMigDeviceHandle(self, handle: FakeHandle) -> int:
        self._gpu("nvmlDeviceIsMigDeviceHandle", handle)
        return 1 if handle.mig_index >= 0 else 0

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: FakeHandle) -> FakeHandle:
        self._gpu("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        if handle.mig_index < 0:
            raise _error("InvalidArgument")
        return FakeHandle(gpu_index=handle.gpu_index)

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeHandle) -> int:
        g = self._gpu("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig_index < 0:
            raise _error("InvalidArgument")
        return g.mig_instances[handle.mig_index].gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeHandle) -> int:
        g = self._gpu("nvmlDeviceGetComputeInstanceId", handle)
        if handle.mig_index < 0:
            raise _error("InvalidArgument")
        return g.mig_instances[handle.mig_index].compute_instance_id

    def nvmlDeviceGetAttributes_v2(self, handle: FakeHandle) -> Any:
        g = self._gpu("nvmlDeviceGetAttributes_v2", handle)
        attrs = pynvml.c_nvmlDeviceAttributes()
        if handle.mig_index >= 0:
            mig = g.mig_instances[handle.mig_index]
            attrs.gpuInstanceSliceCount = mig.slices
            attrs.computeInstanceSliceCount = mig.slices
            attrs.memorySizeMB = mig.memory_bytes // 2**20
            attrs.multiprocessorCount = 14 * mig.slices
        else:
            attrs.gpuInstanceSliceCount = 7 if g.mig_enabled is not None else 0
            attrs.computeInstanceSliceCount = attrs.gpuInstanceSliceCount
            attrs.memorySizeMB = g.memory_bytes // 2**20
            attrs.multiprocessorCount = 108
        return attrs

    def nvmlDeviceGetAttributes(self, handle: FakeHandle) -> Any:
        return self.nvmlDeviceGetAttributes_v2(handle)

    # --- pynvml: usage ------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        g = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        if handle.mig_index >= 0 or g.mig_enabled:
            # NVML has no utilization counters for MIG-mode GPUs.
            raise _error("NotSupported")
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = g.utilization_percent
        util.memory = min(100, g.memory_used_bytes * 100 // g.memory_bytes)
        return util

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return self._process_infos(g, handle, g.processes)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        g = self._gpu("nvmlDeviceGetMPSComputeRunningProcesses", handle)
        if not self.mps_listing:
            raise _error("FunctionNotFound")
        return self._process_infos(g, handle, self._mps_processes.get(handle.gpu_index, ()))

    def _process_infos(self, g: GPUSpec, handle: FakeHandle, procs: tuple[ProcessSpec, ...]) -> list[Any]:
        if handle.mig_index >= 0:
            gi = g.mig_instances[handle.mig_index].gpu_instance_id
            procs = tuple(p for p in procs if p.gpu_instance_id == gi)
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": p.pid,
                    "usedGpuMemory": p.used_memory_bytes,
                    "gpuInstanceId": p.gpu_instance_id,
                    "computeInstanceId": p.compute_instance_id,
                }
            )
            for p in procs
        ]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: FakeHandle) -> list[Any]:
        return self.nvmlDeviceGetComputeRunningProcesses(handle)

    # --- pynvml: events -----------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._checked("nvmlEventSetCreate")
        event_set = FakeEventSet()
        with self._cond:
            self._sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, event_types: int, event_set: FakeEventSet) -> None:
        g = self._gpu("nvmlDeviceRegisterEvents", handle)
        if not g.supports_events or handle.mig_index >= 0:
            raise _error("NotSupported")
        with self._cond:
            event_set.registered[g.index] = event_set.registered.get(g.index, 0) | event_types

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeHandle) -> int:
        g = self._gpu("nvmlDeviceGetSupportedEventTypes", handle)
        return int(pynvml.nvmlEventTypeXidCriticalError) if g.supports_events else 0

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeoutms: int) -> FakeEventData:
        self._checked("nvmlEventSetWait_v2")
        deadline = time.monotonic() + timeoutms / 1000.0
        with self._cond:
            while True:
                event = self._take_due(event_set)
                if event is not None:
                    if event.xid == XID_FALLEN_OFF_BUS:
                        g = self._gpus[event.gpu_index]
                        self._gpus[event.gpu_index] = replace(g, lost=True)
                    return FakeEventData(
                        device=FakeHandle(gpu_index=event.gpu_index),
                        eventType=int(pynvml.nvmlEventTypeXidCriticalError),
                        eventData=event.xid,
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _error("Timeout")
                next_due = min((p.due for p in self._pending), default=None)
                wait = remaining if next_due is None else min(remaining, max(0.001, next_due - self._clock()))
                self._cond.wait(wait)

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeoutms: int) -> FakeEventData:
        return self.nvmlEventSetWait_v2(event_set, timeoutms)

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._checked("nvmlEventSetFree")
        with self._cond:
            if event_set in self._sets:
                self._sets.remove(event_set)
            self._cond.notify_all()

    # --- internals ----------------------------------------------------------------------

    def _take_due(self, event_set: FakeEventSet) -> _PendingEvent | None:
        now = self._clock()
        for i, p in enumerate(self._pending):
            if p.due <= now and event_set.registered.get(p.gpu_index, 0) & int(pynvml.nvmlEventTypeXidCriticalError):
                return self._pending.pop(i)
        return None

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _require_init(self) -> None:
        if self._init_count <= 0:
            raise _error("Uninitialized")

    def _checked(self, name: str) -> None:
        self._count(name)
        self._require_init()

    def _handle_of(self, index: int) -> FakeHandle:
        return FakeHandle(gpu_index=index)

    def _gpu(self, name: str, handle: FakeHandle) -> GPUSpec:
        self._checked(name)
        if self._usage_file:
            self._follow_usage_file()
        if not isinstance(handle, FakeHandle) or not 0 <= handle.gpu_index < len(self._gpus):
            raise _error("InvalidArgument")
        g = self._gpus[handle.gpu_index]
        if g.lost:
            raise _error("GpuIsLost")
        if handle.mig_index >= 0 and (not g.mig_enabled or handle.mig_index >= len(g.mig_instances)):
            raise _error("InvalidArgument")
        return g

    def _follow_usage_file(self) -> None:
        for index, used, processes in self._usage.changes(gpus=len(self._gpus)):
            self.set_usage(index, memory_used_bytes=used, processes=processes)


def _link_remotes(g: GPUSpec) -> list[str]:
    """One entry per physical link, as NVML enumerates them."""
    return [link.remote_bus_id for link in g.nvlinks for _ in range(link.links)]


def _pci_info(bus_id: str) -> Any:
    info = pynvml.nvmlPciInfo_t()
    domain, bus, rest = bus_id.split(":")
    device, _function = rest.split(".")
    info.busId = bus_id.encode()
    info.busIdLegacy = f"{domain[-4:]}:{bus}:{rest}".encode()
    info.domain = int(domain, 16)
    info.bus = int(bus, 16)
    info.device = int(device, 16)
    return info
