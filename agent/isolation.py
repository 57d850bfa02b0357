"""What each isolation backend adds to a container that got GPU shares.

Pure: from the verified shares to env variables and mounts. The hook
(`agent.hook`) decides whether a container gets anything; this module says
what, per backend:

- `hami-core`: HAMi's libvgpu.so, preloaded through /etc/ld.so.preload,
  enforces `CUDA_DEVICE_MEMORY_LIMIT_<i>` and `CUDA_DEVICE_SM_LIMIT(_<i>)`,
  and keeps its accounting in a per-container shared cache file;
- `mps`: the NVIDIA MPS server enforces `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
  and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for clients that reach its pipe
  directory;
- `none`: the container only sees its GPUs.

Whole GPUs and MIG instances need no software limit (the container owns
the GPU, or the hardware enforces the split), so when every share is one of
those, the backend adds nothing but visibility.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass

from apis import names

_MIB = 2**20


class Isolation(enum.Enum):
    HAMI_CORE = "hami-core"
    MPS = "mps"
    NONE = "none"

    @classmethod
    def parse(cls, value: str, *, field: str = "isolation") -> Isolation:
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(i.value for i in cls)
            raise ValueError(f"{field}={value!r} is not an isolation backend; use one of {known}") from None


@dataclass(frozen=True)
class IsolationPaths:
    """Host and container paths the backends mount; configurable in the agent's config file."""

    #: HAMi-core library on the host.
    hami_library: str = "/usr/local/vgpu/libvgpu.so"
    #: Host file mounted as the container's /etc/ld.so.preload; it holds the
    #: container path of the library (`hami_container_dir`/libvgpu.so).
    hami_preload: str = "/usr/local/vgpu/ld.so.preload"
    #: Host directory under which each container gets its own cache directory.
    hami_cache_root: str = "/var/lib/fgpu/hami-cache"
    #: HAMi-core's cross-process lock directory, shared by all containers on the node.
    hami_lock_dir: str = "/tmp/vgpulock"
    #: Where the library and the cache directory appear inside the container.
    hami_container_dir: str = "/usr/local/vgpu"
    #: Pipe directory of the node's MPS control daemon (mounted at the same path).
    mps_pipe_dir: str = "/run/nvidia/mps"


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    readonly: bool = True


@dataclass(frozen=True)
class VisibleGPU:
    """One GPU as the container will see it, in CUDA ordinal order."""

    uuid: str  # GPU or MIG UUID, what NVIDIA_VISIBLE_DEVICES lists
    core_percent: int
    memory_bytes: int
    #: True when no software limit is needed (whole GPU, or a MIG instance).
    unlimited: bool


@dataclass(frozen=True)
class ContainerEdits:
    envs: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    #: Host directories that must exist before the container starts.
    host_dirs: tuple[str, ...] = ()


def edits_for(
    gpus: Sequence[VisibleGPU], *, isolation: Isolation, paths: IsolationPaths, pod_uid: str, container_name: str
) -> ContainerEdits:
    """The env and mounts that give a container `gpus` under `isolation`."""
    envs: list[tuple[str, str]] = [
        (names.NVIDIA_VISIBLE_DEVICES, ",".join(g.uuid for g in gpus)),
        (names.CUDA_DEVICE_ORDER, names.CUDA_DEVICE_ORDER_PCI_BUS_ID),
    ]
    limited = any(not g.unlimited for g in gpus)
    applied = isolation if limited else Isolation.NONE
    mounts: list[Mount] = []
    host_dirs: list[str] = []
    if applied is Isolation.HAMI_CORE:
        cache_host = os.path.join(paths.hami_cache_root, f"{pod_uid}_{container_name}")
        cache_container = os.path.join(paths.hami_container_dir, "cache")
        for i, g in enumerate(gpus):
            envs.append((f"{names.HAMI_MEMORY_LIMIT_PREFIX}{i}", f"{g.memory_bytes // _MIB}m"))
            envs.append((f"{names.HAMI_SM_LIMIT}_{i}", str(_sm_limit(g))))
        # The unsuffixed limit covers tools that read only it; the smallest share is the safe reading.
        envs.append((names.HAMI_SM_LIMIT, str(min(_sm_limit(g) for g in gpus))))
        envs.append((names.HAMI_SHARED_CACHE, os.path.join(cache_container, "vgpu.cache")))
        mounts += [
            Mount(container_path=cache_container, host_path=cache_host, readonly=False),
            Mount(container_path=os.path.join(paths.hami_container_dir, "libvgpu.so"), host_path=paths.hami_library),
            Mount(container_path="/etc/ld.so.preload", host_path=paths.hami_preload),
            Mount(container_path=paths.hami_lock_dir, host_path=paths.hami_lock_dir, readonly=False),
        ]
        host_dirs += [cache_host, paths.hami_lock_dir]
    elif applied is Isolation.MPS:
        envs.append((names.MPS_PIPE_DIRECTORY, paths.mps_pipe_dir))
        envs.append(
            (names.MPS_PINNED_MEM_LIMIT, ",".join(f"{i}={g.memory_bytes // _MIB}M" for i, g in enumerate(gpus)))
        )
        # MPS takes one thread percentage for all of a client's devices; the smallest share is the
        # safe one. A memory-only share (core 0) gets no compute cap: MPS has no "0 = unlimited".
        threads = min(_sm_limit(g) for g in gpus)
        if threads > 0:
            envs.append((names.MPS_ACTIVE_THREAD_PERCENTAGE, str(threads)))
        mounts.append(Mount(container_path=paths.mps_pipe_dir, host_path=paths.mps_pipe_dir, readonly=False))
    envs += [
        (names.FGPU_GPU_UUIDS, ",".join(g.uuid for g in gpus)),
        (names.FGPU_MEMORY_BYTES, ",".join(str(g.memory_bytes) for g in gpus)),
        (names.FGPU_CORE_PERCENT, ",".join(str(g.core_percent) for g in gpus)),
        (names.FGPU_ISOLATION, applied.value),
    ]
    return ContainerEdits(envs=tuple(envs), mounts=tuple(mounts), host_dirs=tuple(host_dirs))


def _sm_limit(g: VisibleGPU) -> int:
    # A memory-only share has core 0, which HAMi-core reads as "no limit".
    return 100 if g.unlimited else g.core_percent
