"""Hook edits as values, and the pure rules for merging them into a container's settings.

A hook never hands back a whole list: it says which variables to set or
unset, which mounts and devices to add. These functions merge such edits into
what the request already holds, keeping everything else (and its order).
They are generic over the item type so the CRI adapter can merge its own
protobuf entries (whose unknown fields must survive) with the same rules the
tests check on plain values.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")
V = TypeVar("V")


@dataclass(frozen=True)
class MountEdit:
    container_path: str
    host_path: str
    readonly: bool = False
    selinux_relabel: bool = False
    #: CRI MountPropagation number: 0 private, 1 host-to-container, 2 bidirectional
    propagation: int = 0


@dataclass(frozen=True)
class DeviceEdit:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ResourceEdit:
    """Linux resource fields a hook overrides; None keeps the request's value."""

    cpu_period: int | None = None
    cpu_quota: int | None = None
    cpu_shares: int | None = None
    memory_limit_in_bytes: int | None = None
    oom_score_adj: int | None = None
    cpuset_cpus: str | None = None
    cpuset_mems: str | None = None
    memory_swap_limit_in_bytes: int | None = None
    unified: Mapping[str, str] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not self.unified and all(
            getattr(self, name) is None
            for name in (
                "cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj",
                "cpuset_cpus", "cpuset_mems", "memory_swap_limit_in_bytes",
            )
        )


@dataclass(frozen=True)
class Edits:
    """One hook server's answer, as values."""

    set_envs: tuple[tuple[str, str], ...] = ()
    unset_envs: tuple[str, ...] = ()
    add_mounts: tuple[MountEdit, ...] = ()
    add_devices: tuple[DeviceEdit, ...] = ()
    add_cdi_devices: tuple[str, ...] = ()
    set_annotations: tuple[tuple[str, str], ...] = ()
    remove_annotations: tuple[str, ...] = ()
    resources: ResourceEdit = field(default_factory=ResourceEdit)

    def counts(self) -> dict[str, int]:
        """Edits by kind, for metrics: env, mount, device, cdi, annotation, resources."""
        return {
            "env": len(self.set_envs) + len(self.unset_envs),
            "mount": len(self.add_mounts),
            "device": len(self.add_devices),
            "cdi": len(self.add_cdi_devices),
            "annotation": len(self.set_annotations) + len(self.remove_annotations),
            "resources": 0 if self.resources.is_empty() else 1,
        }

    def sets_env(self, name: str) -> bool:
        return any(key == name for key, _ in self.set_envs)


def merge_env(
    current: Sequence[tuple[str, V]], *, set_envs: Sequence[tuple[str, V]], unset: Collection[str]
) -> list[tuple[str, V]]:
    """`current` with `unset` removed, then each of `set_envs` replacing the first variable of its name
    in place (later duplicates dropped, as the runtime would let the last one win) or appended."""
    setting: dict[str, V] = {}
    for key, value in set_envs:
        setting[key] = value
    out: list[tuple[str, V]] = []
    placed: set[str] = set()
    for key, value in current:
        if key in unset and key not in setting:
            continue
        if key in setting:
            if key in placed:
                continue
            out.append((key, setting[key]))
            placed.add(key)
        else:
            out.append((key, value))
    for key, value in setting.items():
        if key not in placed:
            out.append((key, value))
    return out


def merge_by_key(current: Sequence[T], added: Sequence[T], *, key: Callable[[T], str]) -> list[T]:
    """`current` with each of `added` replacing the entry of the same key in place, or appended."""
    replacing: dict[str, T] = {}
    for item in added:
        replacing[key(item)] = item
    out: list[T] = []
    placed: set[str] = set()
    for item in current:
        k = key(item)
        if k in replacing:
            if k not in placed:
                out.append(replacing[k])
                placed.add(k)
        else:
            out.append(item)
    out.extend(item for k, item in replacing.items() if k not in placed)
    return out


def merge_names(current: Sequence[str], added: Sequence[str]) -> list[str]:
    """`current` plus those of `added` not yet in it, in order (CDI device names)."""
    out = list(current)
    seen = set(out)
    for name in added:
        if name not in seen:
            out.append(name)
            seen.add(name)
    return out


def merge_annotations(
    current: Mapping[str, str], *, set_annotations: Sequence[tuple[str, str]], remove: Collection[str]
) -> dict[str, str]:
    out = {k: v for k, v in current.items() if k not in remove}
    out.update(set_annotations)
    return out
