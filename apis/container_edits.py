"""A hook's edits as values: what a `HookResponse` (proto/fgpu/v1/hooks.proto) asks of a container.

The agent's GPU hook builds them (`agent.isolation`) and answers with `to_proto`; the runtime
proxy reads every hook's answer with `from_proto` and applies it to the CRI request
(`runtimeproxy.crimsg`). A hook never hands back a whole list, only what to set, unset or add;
each field of `ContainerEdits` is one field of the response (`rejection` aside)::

    ContainerEdits(
        envs=(("NVIDIA_VISIBLE_DEVICES", "GPU-0b1c..."),),       # set_envs
        unset_envs=("CUDA_DEVICE_MEMORY_LIMIT",),                 # unset_envs
        mounts=(Mount("/etc/ld.so.preload", "/usr/local/vgpu/ld.so.preload"),),  # add_mounts
        devices=(DeviceNode("/dev/nvidia-uvm", "/dev/nvidia-uvm"),),  # add_devices
        cdi_devices=("nvidia.com/gpu=0",),                        # add_cdi_devices
        set_annotations=(("example.com/k", "v"),),                # set_annotations
        remove_annotations=("example.com/old",),                  # remove_annotations
        resources=CgroupResources(unified={"pids.max": "4096"}),  # resources
    )

A sandbox or resource-update stage's answer is read the same way; only its annotations and
resources apply there.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from apis.fgpu.v1 import hooks_pb2


class Propagation(enum.Enum):
    """How a mount propagates; the values are the protocol's (and the CRI's) `MountPropagation` numbers."""

    PRIVATE = 0
    HOST_TO_CONTAINER = 1
    BIDIRECTIONAL = 2


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    #: Read-only unless asked otherwise: a backend mounting a host file shares it, not hands it over.
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


#: The optional scalar fields of `LinuxResources`, named alike here, in the protocol and in the CRI.
RESOURCE_FIELDS: Final = (
    "cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
    "cpuset_cpus", "cpuset_mems", "memory_swap_limit_in_bytes",
)


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
        return not self.unified and all(getattr(self, name) is None for name in RESOURCE_FIELDS)


@dataclass(frozen=True)
class ContainerEdits:
    """One hook's edits, in the order the runtime proxy applies them (docs/runtime-proxy.md)."""

    #: Variables to set: each replaces the variable of its name in place, or is appended.
    envs: tuple[tuple[str, str], ...] = ()
    #: Variables to remove (applied before `envs`).
    unset_envs: tuple[str, ...] = ()
    #: Mounts to add; one with the container path of an existing mount replaces it.
    mounts: tuple[Mount, ...] = ()
    #: Device nodes to add; one with the container path of an existing node replaces it.
    devices: tuple[DeviceNode, ...] = ()
    #: Fully qualified CDI device names to add, e.g. "nvidia.com/gpu=0".
    cdi_devices: tuple[str, ...] = ()
    set_annotations: tuple[tuple[str, str], ...] = ()
    remove_annotations: tuple[str, ...] = ()
    resources: CgroupResources = field(default_factory=CgroupResources)

    def sets_env(self, name: str) -> bool:
        return any(key == name for key, _ in self.envs)


class EditsError(ValueError):
    """A hook's answer says something no container can be given."""


def to_proto(edits: ContainerEdits) -> hooks_pb2.HookResponse:
    """Each kind of edit onto the response's field for it."""
    return hooks_pb2.HookResponse(
        set_envs=[hooks_pb2.KeyValue(key=k, value=v) for k, v in edits.envs],
        unset_envs=list(edits.unset_envs),
        add_mounts=[
            hooks_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, readonly=m.readonly,
                selinux_relabel=m.selinux_relabel,
                propagation=f"PROPAGATION_{m.propagation.name}",
            )
            for m in edits.mounts
        ],
        add_devices=[
            hooks_pb2.Device(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in edits.devices
        ],
        add_cdi_devices=list(edits.cdi_devices),
        set_annotations=dict(edits.set_annotations),
        remove_annotations=list(edits.remove_annotations),
        resources=None if edits.resources.is_empty() else _resources_to_proto(edits.resources),
    )


def _resources_to_proto(r: CgroupResources) -> hooks_pb2.LinuxResources:
    # Only the fields that are set: the proto's optional fields keep "unset" apart from 0.
    fields = {name: getattr(r, name) for name in RESOURCE_FIELDS if getattr(r, name) is not None}
    return hooks_pb2.LinuxResources(unified=dict(r.unified), **fields)


def from_proto(resp: hooks_pb2.HookResponse) -> ContainerEdits:
    """The edits of a hook's answer (its `rejection` is the caller's to read).

    Raises EditsError for a mount propagation the protocol does not define (a hook built
    against another version of it).
    """
    res = resp.resources
    return ContainerEdits(
        envs=tuple((kv.key, kv.value) for kv in resp.set_envs),
        unset_envs=tuple(resp.unset_envs),
        mounts=tuple(
            Mount(
                container_path=m.container_path, host_path=m.host_path, readonly=m.readonly,
                selinux_relabel=m.selinux_relabel, propagation=_propagation(i, int(m.propagation)),
            )
            for i, m in enumerate(resp.add_mounts)
        ),
        # An unset permission (proto3's empty string) means the CRI's usual "rw".
        devices=tuple(
            DeviceNode(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions or "rw")
            for d in resp.add_devices
        ),
        cdi_devices=tuple(resp.add_cdi_devices),
        set_annotations=tuple(sorted(resp.set_annotations.items())),
        remove_annotations=tuple(resp.remove_annotations),
        resources=CgroupResources(
            **{name: getattr(res, name) if res.HasField(name) else None for name in RESOURCE_FIELDS},
            unified=dict(res.unified),
        ),
    )


def _propagation(index: int, number: int) -> Propagation:
    try:
        return Propagation(number)
    except ValueError:
        known = ", ".join(f"{p.value} ({p.name})" for p in Propagation)
        raise EditsError(
            f"add_mounts[{index}].propagation={number} is not a MountPropagation of fgpu.v1 (known: {known}); "
            "the hook server must answer with one of those"
        ) from None
