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

The pod author writes the container's env and picks its image, so nothing they
wrote may decide a limit: every variable of the applied backend is set by the
hook (its off switches pinned to their safe value, which also overrides what the
image bakes in), and every other isolation variable the pod spec carries is
removed. Both backends read these variables inside the container's processes;
what that leaves a hostile process is in docs/isolation.md.
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
    #: Host directory for HAMi-core's cross-process locks, shared by all containers on the node and
    #: mounted at `HAMI_LOCK_DIR_IN_CONTAINER`. Not under /tmp: a world-writable parent would let
    #: anyone plant a symlink there before the agent makes the directory writable by every container.
    hami_lock_dir: str = "/var/lib/fgpu/vgpulock"
    #: Where the library and the cache directory appear inside the container.
    hami_container_dir: str = "/usr/local/vgpu"
    #: Pipe directory of the node's MPS control daemon (mounted at the same path).
    mps_pipe_dir: str = "/run/nvidia/mps"


#: HAMi-core's lock directory inside the container; the library has it built in.
HAMI_LOCK_DIR_IN_CONTAINER = "/tmp/vgpulock"


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
    #: Variables of the request to remove (applied before `envs`).
    unset_envs: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    #: Host directories that must exist before the container starts.
    host_dirs: tuple[str, ...] = ()


#: Variables only HAMi-core reads that are not covered by `names.ISOLATION_ENV_PREFIXES`.
_HAMI_NAMES = (
    names.HAMI_SHARED_CACHE, names.HAMI_DISABLE_CONTROL, names.HAMI_OVERSUBSCRIBE, names.HAMI_CORE_POLICY,
    names.HAMI_REDIRECT,
)


def is_isolation_variable(name: str) -> bool:
    """Whether HAMi-core or the MPS client reads `name`."""
    return name in _HAMI_NAMES or name.startswith(names.ISOLATION_ENV_PREFIXES)


def void_edits() -> ContainerEdits:
    """A container of a GPU pod that asked for no GPU itself: it sees none."""
    return ContainerEdits(envs=((names.NVIDIA_VISIBLE_DEVICES, names.NVIDIA_VISIBLE_DEVICES_VOID),))


def edits_for(
    gpus: Sequence[VisibleGPU],
    *,
    isolation: Isolation,
    paths: IsolationPaths,
    pod_uid: str,
    container_name: str,
    request_env: Sequence[str] = (),
) -> ContainerEdits:
    """The env and mounts that give a container `gpus` under `isolation`.

    `request_env`: the names of the variables the container's request carries now; the
    isolation variables among them that the hook does not set are removed.
    """
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
        envs.append((names.HAMI_MEMORY_LIMIT, f"{min(g.memory_bytes for g in gpus) // _MIB}m"))
        envs.append((names.HAMI_SHARED_CACHE, os.path.join(cache_container, "vgpu.cache")))
        # HAMi-core resolves CUDA symbols through the library this names: pointing it at the real
        # libcuda would skip every limit. Its built-in default is the library's own path.
        envs.append((names.HAMI_REDIRECT, os.path.join(paths.hami_container_dir, "libvgpu.so")))
        # Pinned rather than removed: the image's own ENV would otherwise still apply.
        envs += [
            (names.HAMI_DISABLE_CONTROL, "false"),
            (names.HAMI_OVERSUBSCRIBE, "false"),
            (names.HAMI_CORE_POLICY, "default"),
        ]
        mounts += [
            Mount(container_path=cache_container, host_path=cache_host, readonly=False),
            Mount(container_path=os.path.join(paths.hami_container_dir, "libvgpu.so"), host_path=paths.hami_library),
            Mount(container_path="/etc/ld.so.preload", host_path=paths.hami_preload),
            Mount(container_path=HAMI_LOCK_DIR_IN_CONTAINER, host_path=paths.hami_lock_dir, readonly=False),
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
        envs.append((names.MPS_ACTIVE_THREAD_PERCENTAGE, str(threads if threads > 0 else 100)))
        mounts.append(Mount(container_path=paths.mps_pipe_dir, host_path=paths.mps_pipe_dir, readonly=False))
    if applied is not Isolation.NONE:
        # Both backends index their limits by CUDA ordinal; a reordering filter would pair a
        # GPU with another GPU's limit.
        envs.append((names.CUDA_VISIBLE_DEVICES, ",".join(str(i) for i in range(len(gpus)))))
    envs += [
        (names.FGPU_GPU_UUIDS, ",".join(g.uuid for g in gpus)),
        (names.FGPU_MEMORY_BYTES, ",".join(str(g.memory_bytes) for g in gpus)),
        (names.FGPU_CORE_PERCENT, ",".join(str(g.core_percent) for g in gpus)),
        (names.FGPU_ISOLATION, applied.value),
    ]
    setting = {k for k, _ in envs}
    unset = tuple(sorted({n for n in request_env if is_isolation_variable(n) and n not in setting}))
    return ContainerEdits(envs=tuple(envs), unset_envs=unset, mounts=tuple(mounts), host_dirs=tuple(host_dirs))


def _sm_limit(g: VisibleGPU) -> int:
    # A memory-only share has core 0, which HAMi-core reads as "no limit".
    return 100 if g.unlimited else g.core_percent
