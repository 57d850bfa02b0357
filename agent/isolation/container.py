"""What one container with GPU shares gets: visibility, its backend's edits, the FGPU_* variables.

Pure. The hook (`agent.hook`) decides whether a container gets anything; this module says what:
every container sees exactly its GPUs (`NVIDIA_VISIBLE_DEVICES`, in PCI bus order), and when at
least one of them is a limited share the configured backend adds its limits (its module's
`edits`). Whole GPUs and MIG instances need no software limit (the container owns the GPU, or
the hardware enforces the split), so when every share is one of those the `none` backend applies.

The pod author writes the container's env and picks its image, so nothing they wrote may decide
a limit: every variable of the applied backend is set by the hook (its off switches pinned to
their safe value, which also overrides what the image bakes in), and every variable any
registered backend reads that the hook does not set is removed from the pod's own env. What
that leaves a hostile process is in docs/isolation.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agent.isolation import registry
from agent.isolation.edits import BackendEdits, VisibleGPU
from agent.isolation.registry import IsolationPaths
from apis import names
from apis.container_edits import ContainerEdits


def is_isolation_variable(name: str) -> bool:
    """Whether the library of any registered backend reads `name`."""
    return any(True for _ in registry.iter_env_readers(name))


def void_edits() -> BackendEdits:
    """A container of a GPU pod that asked for no GPU itself: it sees none."""
    return BackendEdits(ContainerEdits(envs=((names.NVIDIA_VISIBLE_DEVICES, names.NVIDIA_VISIBLE_DEVICES_VOID),)))


def applied_backend(gpus: Sequence[VisibleGPU], *, isolation: str) -> registry.Backend:
    """`isolation`'s backend when a share on `gpus` needs a software limit, else `none`'s."""
    limited = any(not g.unlimited for g in gpus)
    return registry.backend(isolation if limited else names.ISOLATION_NONE)


def edits_for(
    gpus: Sequence[VisibleGPU],
    *,
    isolation: str,
    paths: IsolationPaths,
    pod_uid: str,
    container_name: str,
    request_env: Sequence[str] = (),
) -> BackendEdits:
    """The edits that give a container `gpus` (in CUDA ordinal order) under the backend `isolation`.

    `request_env`: the names of the variables the container's request carries now; the
    isolation variables among them that the hook does not set are removed.
    """
    applied = applied_backend(gpus, isolation=isolation)
    given = applied.edits(gpus, paths=paths, pod_uid=pod_uid, container_name=container_name)
    own = given.edits
    envs: list[tuple[str, str]] = [
        (names.NVIDIA_VISIBLE_DEVICES, ",".join(g.uuid for g in gpus)),
        (names.CUDA_DEVICE_ORDER, names.CUDA_DEVICE_ORDER_PCI_BUS_ID),
        *own.envs,
    ]
    if applied.enforces_limits:
        # Backends index their limits by CUDA ordinal; a reordering filter would pair a GPU with
        # another GPU's limit.
        envs.append((names.CUDA_VISIBLE_DEVICES, ",".join(str(i) for i in range(len(gpus)))))
    envs += [
        (names.FGPU_GPU_UUIDS, ",".join(g.uuid for g in gpus)),
        (names.FGPU_MEMORY_BYTES, ",".join(str(g.memory_bytes) for g in gpus)),
        (names.FGPU_CORE_PERCENT, ",".join(str(g.core_percent) for g in gpus)),
        (names.FGPU_ISOLATION, applied.name),
    ]
    setting = {k for k, _ in envs}
    unset = {n for n in request_env if n not in setting and is_isolation_variable(n)}
    unset.update(n for n in own.unset_envs if n not in setting)
    return BackendEdits(
        replace(own, envs=tuple(envs), unset_envs=tuple(sorted(unset))), host_dirs=given.host_dirs
    )
