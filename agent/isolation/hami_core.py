"""`hami-core`: HAMi's libvgpu.so, preloaded through /etc/ld.so.preload, caps memory and compute.

The library enforces `CUDA_DEVICE_MEMORY_LIMIT_<i>` and `CUDA_DEVICE_SM_LIMIT(_<i>)` per CUDA
ordinal and keeps its accounting in a per-container shared cache file (`hami_cache`), under
cross-process locks in a directory shared by every container of the node. The agent's
DaemonSet installs the library and the preload file (docs/deploy.md); the check reads both,
never loading the library.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence

from agent.isolation import hami_cache
from agent.isolation.edits import BackendEdits, VisibleGPU
from agent.isolation.readiness import BackendStatus, Files, Machine, elf_problem
from agent.isolation.registry import IsolationPaths, PathKey, register_backend
from apis import names
from apis.container_edits import ContainerEdits, Mount

_MIB = 2**20
_HEADER = 64

LIBRARY = PathKey("hamiLibrary", "/usr/local/vgpu/libvgpu.so", "HAMi-core library on the host", is_file=True)
PRELOAD = PathKey(
    "hamiPreload", "/usr/local/vgpu/ld.so.preload",
    "host file mounted as the container's /etc/ld.so.preload; names hamiContainerDir/libvgpu.so", is_file=True,
)
CACHE_ROOT = PathKey("hamiCacheRoot", "/var/lib/fgpu/hami-cache", "host directory holding one cache directory per container")
#: Not under /tmp: a world-writable parent would let anyone plant a symlink there before the agent
#: makes the directory writable by every container.
LOCK_DIR = PathKey(
    "hamiLockDir", "/var/lib/fgpu/vgpulock",
    "host directory for HAMi-core's cross-process locks, mounted at /tmp/vgpulock",
)
CONTAINER_DIR = PathKey(
    "hamiContainerDir", "/usr/local/vgpu", "where the library and the cache directory appear in the container",
    on_host=False,
)

#: HAMi-core's lock directory inside the container; the library has it built in.
LOCK_DIR_IN_CONTAINER = "/tmp/vgpulock"


def edits(gpus: Sequence[VisibleGPU], *, paths: IsolationPaths, pod_uid: str, container_name: str) -> BackendEdits:
    cache_host = os.path.join(paths[CACHE_ROOT], hami_cache.dir_name(pod_uid, container_name))
    cache_container = os.path.join(paths[CONTAINER_DIR], "cache")
    library_in_container = os.path.join(paths[CONTAINER_DIR], "libvgpu.so")
    envs: list[tuple[str, str]] = []
    for i, g in enumerate(gpus):
        envs.append((f"{names.HAMI_MEMORY_LIMIT_PREFIX}{i}", f"{memory_cap(g) // _MIB}m"))
        envs.append((f"{names.HAMI_SM_LIMIT}_{i}", str(sm_limit(g))))
    # The unsuffixed limit covers tools that read only it; the smallest share is the safe reading.
    envs.append((names.HAMI_SM_LIMIT, str(min(sm_limit(g) for g in gpus))))
    envs.append((names.HAMI_MEMORY_LIMIT, f"{min(memory_cap(g) for g in gpus) // _MIB}m"))
    envs.append((names.HAMI_SHARED_CACHE, os.path.join(cache_container, "vgpu.cache")))
    # HAMi-core resolves CUDA symbols through the library this names: pointing it at the real
    # libcuda would skip every limit. Its built-in default is the library's own path.
    envs.append((names.HAMI_REDIRECT, library_in_container))
    # Pinned rather than removed: the image's own ENV would otherwise still apply.
    envs += [
        (names.HAMI_DISABLE_CONTROL, "false"),
        (names.HAMI_OVERSUBSCRIBE, "false"),
        (names.HAMI_CORE_POLICY, "default"),
    ]
    return BackendEdits(
        ContainerEdits(envs=tuple(envs), mounts=(
            Mount(container_path=cache_container, host_path=cache_host, readonly=False),
            Mount(container_path=library_in_container, host_path=paths[LIBRARY]),
            Mount(container_path="/etc/ld.so.preload", host_path=paths[PRELOAD]),
            Mount(container_path=LOCK_DIR_IN_CONTAINER, host_path=paths[LOCK_DIR], readonly=False),
        )),
        host_dirs=(cache_host, paths[LOCK_DIR]),
    )


def sm_limit(g: VisibleGPU) -> int:
    # A memory-only share has core 0, which HAMi-core reads as "no limit". A burstable share is
    # capped at its limit: HAMi-core reads the cap once, at process start (docs/overcommit.md).
    if g.unlimited:
        return 100
    return g.burst_core_percent if g.burstable and g.burst_core_percent else g.core_percent


def memory_cap(g: VisibleGPU) -> int:
    # A burstable share may allocate up to its limit; the node's reclaim evicts it when needed.
    return g.burst_memory_bytes if g.burstable else g.memory_bytes


def check(paths: IsolationPaths, *, files: Files, machine: Machine) -> BackendStatus:
    """The library must be a shared object for this machine's architecture, word size and byte
    order; the preload file must name it where `edits` mounts it in containers."""
    library = paths[LIBRARY]
    fix = "the agent DaemonSet's install-hami-core init container puts it there (docs/deploy.md)"
    try:
        header = files.head(library, _HEADER)
    except OSError as err:
        return BackendStatus(
            names.ISOLATION_HAMI_CORE, False, "LibraryMissing",
            f"isolation hami-core: HAMi-core's library {library} cannot be read ({err.strerror or err}); {fix}",
        )
    reason, wrong = elf_problem(header, machine=machine)
    if reason:
        return BackendStatus(
            names.ISOLATION_HAMI_CORE, False, reason, f"isolation hami-core: {library} cannot be loaded: {wrong}; {fix}"
        )
    expected = os.path.join(paths[CONTAINER_DIR], "libvgpu.so")
    preload = paths[PRELOAD]
    try:
        text = files.head(preload, 4096).decode("utf-8", "replace")
    except OSError as err:
        return BackendStatus(
            names.ISOLATION_HAMI_CORE, False, "PreloadMissing",
            f"isolation hami-core: the preload file {preload} cannot be read ({err.strerror or err}); "
            f"it must name {expected}; {fix}",
        )
    named = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if expected not in named:
        return BackendStatus(
            names.ISOLATION_HAMI_CORE, False, "PreloadMismatch",
            f"isolation hami-core: the preload file {preload} names {', '.join(named) or 'nothing'}, "
            f"not {expected}, so containers would run without HAMi-core's limits; {fix}",
        )
    return BackendStatus(names.ISOLATION_HAMI_CORE, True, "Ready", f"hami-core: {library} is a shared object for {machine.name}")


def on_pod_stopped(paths: IsolationPaths, *, pod_uid: str) -> None:
    # The per-container cache directories of the pod are no longer used by anyone.
    hami_cache.remove_pod_dirs(paths[CACHE_ROOT], pod_uid)


def remove_leftovers(paths: IsolationPaths, *, live_uids: Collection[str], min_age_s: float) -> list[str]:
    return hami_cache.remove_orphans(paths[CACHE_ROOT], live_uids=live_uids, min_age_s=min_age_s)


register_backend(
    names.ISOLATION_HAMI_CORE,
    summary="HAMi-core's libvgpu.so caps memory and compute (default)",
    edits=edits,
    check=check,
    on_pod_stopped=on_pod_stopped,
    remove_leftovers=remove_leftovers,
    path_keys=(LIBRARY, PRELOAD, CACHE_ROOT, LOCK_DIR, CONTAINER_DIR),
    env_names=(
        names.HAMI_SHARED_CACHE, names.HAMI_DISABLE_CONTROL, names.HAMI_OVERSUBSCRIBE, names.HAMI_CORE_POLICY,
        names.HAMI_REDIRECT,
    ),
    env_prefixes=(names.HAMI_MEMORY_LIMIT, names.HAMI_SM_LIMIT),
)
