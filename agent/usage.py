"""One usage cycle: per GPU, SM utilization, memory used and the processes, mapped to pods.

The cycle runs every second on every node, so it is kept cheap: three NVML
calls per GPU, and each process's cgroup file read once in its life (see
`agent.cgroups.PidResolver`). MIG instances get their own entries built from
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
            raw = nvml.nvmlDeviceGetComputeRunningProcesses(target.handle)
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


def targets_from(handles: Mapping[str, Any], *, gpus: Sequence[Any]) -> tuple[SampleTarget, ...]:
    """Sampling targets for the physical GPUs of a discovery (`gpus` are apis.devices.GPUInfo)."""
    return tuple(
        SampleTarget(
            uuid=g.uuid,
            handle=handles[g.uuid],
            mig_instances=tuple((m.gpu_instance_id, m.uuid) for m in g.mig_instances),
        )
        for g in gpus
        if g.uuid in handles
    )
