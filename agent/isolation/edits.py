"""What a backend hands a container, as values: the GPUs it sees and the backend's answer.

A backend's `edits` answers with `BackendEdits`: the protocol's edits
(`apis.container_edits.ContainerEdits`: variables to set and to unset, bind mounts, device
nodes, CDI devices, annotations and cgroup resources), which the hook server sends as its
`HookResponse`, and the host directories the agent must make before the container starts,
which never leave the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apis.container_edits import ContainerEdits


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
class BackendEdits:
    """What a container gets: the edits the hook answers with, and the agent's own work before it."""

    edits: ContainerEdits = field(default_factory=ContainerEdits)
    #: Host directories that must exist (writable by any user, sticky) before the container starts.
    host_dirs: tuple[str, ...] = ()
