"""One usage cycle: per GPU, SM utilization, memory used and the processes, mapped to pods.

The cycle runs every second on every node, so it is kept cheap: four NVML
calls per GPU (three where the driver has no MPS listing), and each process's
cgroup file read once in its life (see `agent.cgroups.PidResolver`).

Under MPS a client's memory is listed by `nvmlDeviceGetMPSComputeRunningProcesses`,
which may not be among `nvmlDeviceGetComputeRunningProcesses` (there the MPS
server can stand for its clients), so both lists are read and joined by pid: a
pod whose processes are MPS clients still shows its memory to reclaim. A driver
without the MPS call (FunctionNotFound) or a GPU that does not support it
(NotSupported) is remembered and not asked again. MIG instances get their own entries built from
the parent's process list (processes carry their GPU instance id), which
costs no extra NVML call.

A GPU that fails its calls with a "GPU gone" error comes back with `error`
set; the daemon feeds that to the health tracker, so the usage cycle is also
the periodic health check.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent import nvmlapi
from agent.cgroups import PidResolver
from agent.nvmlapi import NVML

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    pod_uid: str
    container_id: str
    used_memory_bytes: int


@dataclass(frozen=True)
class GPUUsage:
    uuid: str
    sm_utilization_percent: int = 0
    memory_used_bytes: int = 0
    processes: tuple[ProcessUsage, ...] = ()
    #: Non-empty when the GPU did not answer; then the numbers are zero.
    error: str = ""


@dataclass(frozen=True)
class SampleTarget:
    """A physical GPU to sample, with its MIG instances as (GPU instance id, MIG UUID)."""

    uuid: str
    handle: Any
    mig_instances: tuple[tuple[int, str], ...] = ()


class UsageSampler:
    def __init__(self, nvml: NVML, *, resolver: PidResolver) -> None:
        self._nvml = nvml
        self._resolver = resolver
        #: GPUs whose driver has no MPS process listing (asked once)
        self._no_mps_listing: set[str] = set()

    def sample(self, targets: Sequence[SampleTarget]) -> tuple[GPUUsage, ...]:
        out: list[GPUUsage] = []
        live: list[int] = []
        for target in targets:
            out.extend(self._sample_one(target, live))
        self._resolver.retain(live)
        return tuple(out)

    def _sample_one(self, target: SampleTarget, live: list[int]) -> list[GPUUsage]:
        nvml = self._nvml
        try:
            memory_used = int(nvml.nvmlDeviceGetMemoryInfo(target.handle).used)
            try:
                sm = int(nvml.nvmlDeviceGetUtilizationRates(target.handle).gpu)
            except nvmlapi.NVMLError_NotSupported:
                sm = 0  # MIG mode has no utilization counters
            raw = _joined(nvml.nvmlDeviceGetComputeRunningProcesses(target.handle), self._mps_clients(target))
        except nvmlapi.GPU_GONE_ERRORS as err:
            return [GPUUsage(uuid=target.uuid, error=nvmlapi.error_text(err))]
        except nvmlapi.NVMLError as err:
            # Not a sign the GPU is gone (e.g. NoPermission in a locked-down container):
            # report zeros, and leave health alone.
            log.debug("GPU %s: usage not readable: %s", target.uuid, nvmlapi.error_text(err))
            return [GPUUsage(uuid=target.uuid)]
        procs: list[ProcessUsage] = []
        by_instance: dict[int, list[ProcessUsage]] = {}
        for p in raw:
            pid = int(p.pid)
            live.append(pid)
            owner = self._resolver.resolve(pid)
            usage = ProcessUsage(
                pid=pid,
                pod_uid=owner.pod_uid,
                container_id=owner.container_id,
                used_memory_bytes=int(p.usedGpuMemory or 0),
            )
            procs.append(usage)
            if target.mig_instances:
                by_instance.setdefault(int(getattr(p, "gpuInstanceId", -1)), []).append(usage)
        result = [GPUUsage(uuid=target.uuid, sm_utilization_percent=sm, memory_used_bytes=memory_used, processes=tuple(procs))]
        for gi, mig_uuid in target.mig_instances:
            mine = tuple(by_instance.get(gi, ()))
            result.append(
                GPUUsage(uuid=mig_uuid, memory_used_bytes=sum(p.used_memory_bytes for p in mine), processes=mine)
            )
        return result


    def _mps_clients(self, target: SampleTarget) -> list[Any]:
        """The GPU's MPS clients; [] where the driver or GPU cannot list them. GPU-gone errors propagate."""
        if target.uuid in self._no_mps_listing:
            return []
        try:
            return list(self._nvml.nvmlDeviceGetMPSComputeRunningProcesses(target.handle))
        except nvmlapi.GPU_GONE_ERRORS:
            raise
        except (nvmlapi.NVMLError_FunctionNotFound, nvmlapi.NVMLLibraryMismatchError, nvmlapi.NVMLError_NotSupported,
                AttributeError) as err:
            # AttributeError: a pynvml too old to know the call.
            log.info("GPU %s: no MPS process listing (%s); MPS clients' memory is read from the compute list only",
                     target.uuid, nvmlapi.error_text(err))
            self._no_mps_listing.add(target.uuid)
            return []
        except nvmlapi.NVMLError as err:
            log.debug("GPU %s: MPS processes not readable: %s", target.uuid, nvmlapi.error_text(err))
            return []


def _joined(compute: Sequence[Any], mps: Sequence[Any]) -> list[Any]:
    """Both process lists, one entry per pid (the larger memory where a pid is in both)."""
    by_pid: dict[int, Any] = {}
    for p in (*compute, *mps):
        pid = int(p.pid)
        seen = by_pid.get(pid)
        if seen is None or int(p.usedGpuMemory or 0) > int(seen.usedGpuMemory or 0):
            by_pid[pid] = p
    return list(by_pid.values())


def targets_from(handles: Mapping[str, Any], *, gpus: Sequence[Any]) -> tuple[SampleTarget, ...]:
    """Sampling targets for the physical GPUs of a discovery (`gpus` are apis.devices.GPUInfo)."""
    return tuple(
        SampleTarget(
            uuid=g.uuid,
            handle=handles[g.uuid],
            mig_instances=tuple((m.gpu_instance_id, m.uuid) for m in g.mig_instances if m.uuid),
        )
        for g in gpus
        if g.uuid in handles
    )
