"""What the hook hands a container, as values: every kind of edit the RuntimeHooks protocol carries.

`ContainerEdits` holds one of each kind a `HookResponse` can say (proto/fgpu/v1/hooks.proto):
variables to set and to unset, bind mounts, device nodes, CDI devices, annotations and cgroup
resources, plus the host directories the agent must make before the container starts. The
hook server (`agent.hookserver`) maps each kind onto the response once, so a backend that
needs a device node or a cgroup limit only returns it here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Propagation(enum.Enum):
    """How a mount propagates; the values are the protocol's `MountPropagation` numbers."""

    PRIVATE = 0
    HOST_TO_CONTAINER = 1
    BIDIRECTIONAL = 2


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    readonly: bool = True
    selinux_relabel: bool = False
    propagation: Propagation = Propagation.PRIVATE


@dataclass(frozen=True)
class DeviceNode:
    """A device node exposed to the container, e.g. /dev/nvidia0."""

    container_path: str
    host_path: str
    #: cgroup permissions: any of "r", "w", "m".
    permissions: str = "rw"


@dataclass(frozen=True)
class CgroupResources:
    """Linux resource fields to override; None keeps the container's own value."""

    cpu_period: int | None = None
    cpu_quota: int | None = None
    cpu_shares: int | None = None
    memory_limit_in_bytes: int | None = None
    oom_score_adj: int | None = None
    cpuset_cpus: str | None = None
    cpuset_mems: str | None = None
    memory_swap_limit_in_bytes: int | None = None
    #: cgroup v2 files, e.g. {"dmem.max": "..."}
    unified: Mapping[str, str] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return self == CgroupResources()


@dataclass(frozen=True)
class VisibleGPU:
    """One GPU as the container will see it, in CUDA ordinal order."""

    uuid: str  # GPU or MIG UUID, what NVIDIA_VISIBLE_DEVICES lists
    core_percent: int
    memory_bytes: int
    #: True when no software limit is needed (whole GPU, or a MIG instance).
    unlimited: bool
    #: A burstable share's signed limits (agent/isolation/burst.py); 0 for a guaranteed share.
    burst_core_percent: int = 0
    burst_memory_bytes: int = 0

    @property
    def burstable(self) -> bool:
        return self.burst_memory_bytes > 0


@dataclass(frozen=True)
class ContainerEdits:
    envs: tuple[tuple[str, str], ...] = ()
    #: Variables of the request to remove (applied before `envs`).
    unset_envs: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceNode, ...] = ()
    #: Fully qualified CDI device names, e.g. "nvidia.com/gpu=0".
    cdi_devices: tuple[str, ...] = ()
    set_annotations: tuple[tuple[str, str], ...] = ()
    remove_annotations: tuple[str, ...] = ()
    resources: CgroupResources = field(default_factory=CgroupResources)
    #: Host directories that must exist (writable by any user, sticky) before the container starts.
    host_dirs: tuple[str, ...] = ()
