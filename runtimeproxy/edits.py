"""The pure rules for merging hook edits into a container's settings, and their counts for metrics.

A hook never hands back a whole list (`apis.container_edits.ContainerEdits`, read from its
answer): it says which variables to set or unset, which mounts and devices to add. These
functions merge such edits into
what the request already holds, keeping everything else (and its order).
They are generic over the item type so the CRI adapter can merge its own
protobuf entries (whose unknown fields must survive) with the same rules the
tests check on plain values.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TypeVar

from apis.container_edits import ContainerEdits

T = TypeVar("T")
V = TypeVar("V")


def counts(edits: ContainerEdits) -> dict[str, int]:
    """Edits by kind, for metrics: env, mount, device, cdi, annotation, resources."""
    return {
        "env": len(edits.envs) + len(edits.unset_envs),
        "mount": len(edits.mounts),
        "device": len(edits.devices),
        "cdi": len(edits.cdi_devices),
        "annotation": len(edits.set_annotations) + len(edits.remove_annotations),
        "resources": 0 if edits.resources.is_empty() else 1,
    }


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
