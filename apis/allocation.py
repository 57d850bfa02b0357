"""The allocation annotation: Koordinator's `scheduling.koordinator.sh/device-allocated`.

The scheduler writes it on a pod at bind time; the node agent and the runtime
proxy read it to know which GPUs, and how much of each, the pod got. The JSON
is Koordinator's `DeviceAllocations` (`apis/extension/device_share.go`): an
object keyed by device type, each a list of per-device entries::

    {"gpu":[{"id":"GPU-8f2b0c3e","minor":0,
             "resources":{"koordinator.sh/gpu-core":"50",
                          "koordinator.sh/gpu-memory":"20Gi",
                          "koordinator.sh/gpu-memory-ratio":"50"}}]}

A MIG share also carries ``"extension":{"fgpu.io/mig-uuid":"MIG-..."}``, or, for an
instance the node is to create for the pod (docs/mig.md),
``"extension":{"fgpu.io/mig-profile":"3g.40gb","fgpu.io/mig-placement":4}``;
Koordinator decodes "extension" into a struct and skips keys it does not know.

Koordinator's value is per pod, but limits are applied per container, so fgpu's
scheduler also records which containers get each GPU and each one's own share
(``"extension":{"fgpu.io/containers":{"main":{"koordinator.sh/gpu-core":"30",...}}}``,
from `apis.container_split`). A container named in no entry gets no GPU; an
allocation without any such list (Koordinator's own scheduler, or an fgpu before
this field) names no container, and the node refuses to guess.

Reading is tolerant, because Koordinator's own scheduler may have written the
value: quantities may be numbers or strings, "id" may be missing, unknown keys
and other device types ("rdma", "fpga") are ignored. Writing is exact and
canonical (sorted keys, no spaces, memory in its shortest binary form) because
the written string is what the allocation signature covers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from apis import names
from apis.quantity import QuantityError, format_bytes, parse_quantity

_MINOR = "minor"
_ID = "id"
_RESOURCES = "resources"
_EXTENSION = "extension"

#: Percent values of one device: 100 is the whole device.
_MAX_PERCENT = 100


class AllocationError(ValueError):
    """An allocation annotation (or an Allocation value) that cannot be used."""


@dataclass(frozen=True)
class ContainerShare:
    """One container's own part of a pod's GPU share.

    Example: ``"main":{"koordinator.sh/gpu-core":"30","koordinator.sh/gpu-memory":"24Gi",
    "koordinator.sh/gpu-memory-ratio":"30"}`` inside the entry's ``fgpu.io/containers``.
    """

    name: str
    core_percent: int
    memory_bytes: int
    memory_ratio_percent: int

    @property
    def whole(self) -> bool:
        return self.core_percent == _MAX_PERCENT and self.memory_ratio_percent == _MAX_PERCENT


@dataclass(frozen=True)
class ShareLimit:
    """What a burstable share may use on its GPU, above its reserved request (docs/overcommit.md).

    Example: ``"fgpu.io/burstable-limit":{"koordinator.sh/gpu-core":"80",
    "koordinator.sh/gpu-memory":"20Gi","koordinator.sh/gpu-memory-ratio":"25"}`` in the entry's extension.
    """

    core_percent: int
    memory_bytes: int
    memory_ratio_percent: int


@dataclass(frozen=True)
class GPUShare:
    """The part of one GPU a pod got.

    Example entry: ``{"id":"GPU-8f2b","minor":0,"resources":{"koordinator.sh/gpu-core":"50",
    "koordinator.sh/gpu-memory":"20Gi","koordinator.sh/gpu-memory-ratio":"50"}}``.
    """

    minor: int
    uuid: str
    #: Percent of the GPU's compute; 100 = whole GPU, 0 = memory-only share.
    core_percent: int
    memory_bytes: int
    memory_ratio_percent: int
    #: UUID of the MIG instance when the share is one; empty otherwise.
    mig_uuid: str = ""
    #: A MIG instance the node creates for the pod: its profile ("3g.40gb") and placement start
    #: (memory slice); "" and -1 otherwise. Signed with the rest, so the node creates exactly this.
    mig_profile: str = ""
    mig_placement: int = -1
    #: The containers that see this GPU, each with its own part; empty when the writer did not say.
    containers: tuple[ContainerShare, ...] = ()
    #: A burstable share's limit (its presence is the tier); None for a guaranteed share.
    limit: ShareLimit | None = None

    @property
    def whole(self) -> bool:
        """True when the pod has the entire GPU."""
        return self.core_percent == _MAX_PERCENT and self.memory_ratio_percent == _MAX_PERCENT


@dataclass(frozen=True)
class Allocation:
    """Every GPU share of one pod, in the order the container sees the GPUs.

    Example: ``{"gpu":[{"id":"GPU-8f2b","minor":0,"resources":{...}}]}``.
    """

    gpus: tuple[GPUShare, ...]

    @property
    def names_containers(self) -> bool:
        """True when the allocation says which containers get which GPUs (fgpu's scheduler writes it)."""
        return any(g.containers for g in self.gpus)

    @property
    def uuids(self) -> tuple[str, ...]:
        """GPU UUIDs in allocation order (MIG instance UUIDs where the share is one)."""
        return tuple(g.mig_uuid or g.uuid for g in self.gpus)


def share_memory_bytes(share: GPUShare | ContainerShare, *, gpu_memory_bytes: int) -> int:
    """The bytes of memory a share (or a container's part of one) may use on a GPU of `gpu_memory_bytes`.

    The one place this is decided, for the node's hook and the scheduler's counts alike:
    gpu-memory when the allocation gives it; else gpu-memory-ratio of this GPU's size
    (Koordinator may write only the ratio, which the codec reads as 0 bytes); else, for a
    share of all the GPU's compute, all of its memory (a whole GPU); else nothing.
    A MIG share's memory is its instance's, not this.
    """
    if share.memory_bytes:
        return share.memory_bytes
    if share.memory_ratio_percent:
        return gpu_memory_bytes * share.memory_ratio_percent // _MAX_PERCENT
    if share.core_percent == _MAX_PERCENT:
        return gpu_memory_bytes
    return 0


def encode_allocation(allocation: Allocation) -> str:
    """The canonical annotation value for `allocation`.

    The same allocation always gives the same bytes, so signatures over it are
    stable. Raises AllocationError for a value no reader could use.
    """
    entries = []
    for i, share in enumerate(allocation.gpus):
        _check_share(share, where=f"gpus[{i}]")
        entry: dict[str, object] = {
            _MINOR: share.minor,
            _RESOURCES: _resources(share.core_percent, share.memory_bytes, share.memory_ratio_percent),
        }
        if share.uuid:
            entry[_ID] = share.uuid
        extension: dict[str, object] = {}
        if share.mig_uuid:
            extension[names.ALLOCATION_MIG_UUID] = share.mig_uuid
        if share.mig_profile:
            extension[names.ALLOCATION_MIG_PROFILE] = share.mig_profile
            extension[names.ALLOCATION_MIG_PLACEMENT] = share.mig_placement
        if share.containers:
            extension[names.ALLOCATION_CONTAINERS] = {
                c.name: _resources(c.core_percent, c.memory_bytes, c.memory_ratio_percent) for c in share.containers
            }
        if share.limit is not None:
            extension[names.ALLOCATION_BURST_LIMIT] = _resources(
                share.limit.core_percent, share.limit.memory_bytes, share.limit.memory_ratio_percent
            )
        if extension:
            entry[_EXTENSION] = extension
        entries.append(entry)
    return json.dumps({names.DEVICE_TYPE_GPU: entries}, sort_keys=True, separators=(",", ":"))


def _resources(core_percent: int, memory_bytes: int, memory_ratio_percent: int) -> dict[str, str]:
    return {
        names.GPU_CORE: str(core_percent),
        names.GPU_MEMORY: format_bytes(memory_bytes),
        names.GPU_MEMORY_RATIO: str(memory_ratio_percent),
    }


def decode_allocation(text: str) -> Allocation:
    """Reads an annotation value written by fgpu or by Koordinator.

    Raises AllocationError naming the entry, field and value that cannot be read.
    """
    try:
        data = json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        # RecursionError: absurdly nested input must be refused, not crash the reader.
        raise AllocationError(
            f"{names.DEVICE_ALLOCATED}: not valid JSON ({exc}); expected "
            '{"gpu":[{"minor":0,"id":"GPU-...","resources":{...}}]} as the scheduler writes it'
        ) from exc
    if not isinstance(data, dict):
        raise AllocationError(
            f"{names.DEVICE_ALLOCATED}: expected a JSON object keyed by device type, got {_kind(data)}"
        )
    entries = data.get(names.DEVICE_TYPE_GPU)
    if entries is None:
        return Allocation(gpus=())
    if not isinstance(entries, list):
        raise AllocationError(
            f'{names.DEVICE_ALLOCATED}: "gpu" must be a list of device entries, got {_kind(entries)}'
        )
    return Allocation(gpus=tuple(_decode_entry(e, where=f"gpu[{i}]") for i, e in enumerate(entries)))


def _decode_entry(entry: object, *, where: str) -> GPUShare:
    if not isinstance(entry, dict):
        raise AllocationError(f"{names.DEVICE_ALLOCATED}: {where} must be an object, got {_kind(entry)}")
    minor = entry.get(_MINOR)
    if isinstance(minor, bool) or not isinstance(minor, int) or minor < 0:
        raise AllocationError(
            f"{names.DEVICE_ALLOCATED}: {where}.minor={minor!r} is not a GPU minor number; "
            "expected an integer >= 0 (the N of /dev/nvidiaN)"
        )
    uuid = entry.get(_ID, "")
    if uuid is None:
        uuid = ""
    if not isinstance(uuid, str):
        raise AllocationError(f"{names.DEVICE_ALLOCATED}: {where}.id={uuid!r} must be a string GPU UUID")
    resources = entry.get(_RESOURCES) or {}
    if not isinstance(resources, dict):
        raise AllocationError(
            f"{names.DEVICE_ALLOCATED}: {where}.resources must be an object of resource name to "
            f"quantity, got {_kind(resources)}"
        )
    mig_profile, mig_placement = _mig_create(entry.get(_EXTENSION), where=where)
    return GPUShare(
        minor=minor,
        uuid=uuid,
        core_percent=_percent(resources, names.GPU_CORE, where=where),
        memory_bytes=_whole_number(resources, names.GPU_MEMORY, where=where),
        memory_ratio_percent=_percent(resources, names.GPU_MEMORY_RATIO, where=where),
        mig_uuid=_mig_uuid(entry.get(_EXTENSION), where=where),
        mig_profile=mig_profile,
        mig_placement=mig_placement,
        containers=_containers(entry.get(_EXTENSION), where=where),
        limit=_limit(entry.get(_EXTENSION), where=where),
    )


def _limit(extension: object, *, where: str) -> ShareLimit | None:
    if not isinstance(extension, dict) or names.ALLOCATION_BURST_LIMIT not in extension:
        return None
    resources = extension[names.ALLOCATION_BURST_LIMIT]
    field = f"{where}.extension[{names.ALLOCATION_BURST_LIMIT}]"
    if not isinstance(resources, dict):
        raise AllocationError(
            f"{names.DEVICE_ALLOCATED}: {field} must be an object of resource name to quantity, got {_kind(resources)}"
        )
    return ShareLimit(
        core_percent=_percent(resources, names.GPU_CORE, where=field),
        memory_bytes=_whole_number(resources, names.GPU_MEMORY, where=field),
        memory_ratio_percent=_percent(resources, names.GPU_MEMORY_RATIO, where=field),
    )


def _containers(extension: object, *, where: str) -> tuple[ContainerShare, ...]:
    if not isinstance(extension, dict) or names.ALLOCATION_CONTAINERS not in extension:
        return ()
    listed = extension[names.ALLOCATION_CONTAINERS]
    field = f"{where}.extension[{names.ALLOCATION_CONTAINERS}]"
    if not isinstance(listed, dict):
        raise AllocationError(
            f"{names.DEVICE_ALLOCATED}: {field} must be an object of container name to its share, got {_kind(listed)}"
        )
    out = []
    for name, resources in sorted(listed.items()):
        if not isinstance(resources, dict):
            raise AllocationError(
                f"{names.DEVICE_ALLOCATED}: {field}[{name}] must be an object of resource name to quantity, "
                f"got {_kind(resources)}"
            )
        inner = f"{field}[{name}]"
        out.append(ContainerShare(
            name=name,
            core_percent=_percent(resources, names.GPU_CORE, where=inner),
            memory_bytes=_whole_number(resources, names.GPU_MEMORY, where=inner),
            memory_ratio_percent=_percent(resources, names.GPU_MEMORY_RATIO, where=inner),
        ))
    return tuple(out)


def lists_gpus(annotation: str | None) -> bool:
    """Whether an annotation value is a GPU allocation: it lists a GPU, or cannot be read.

    An empty allocation (`{"gpu":[]}`) grants nothing and is treated as none; one that
    cannot be read is treated as a GPU allocation, so the node refuses it with the reason.
    """
    if not annotation:
        return False
    try:
        return bool(decode_allocation(annotation).gpus)
    except AllocationError:
        return True


def _whole_number(resources: Mapping[str, object], name: str, *, where: str) -> int:
    value = resources.get(name)
    if value is None:
        return 0
    field = f"{names.DEVICE_ALLOCATED}: {where}.resources[{name}]"
    try:
        quantity = parse_quantity(value, field=field)
    except QuantityError as exc:
        raise AllocationError(str(exc)) from exc
    except ValueError as exc:  # NaN and Infinity, which Python's JSON reader accepts
        raise AllocationError(f"{field}={value!r} is not a finite quantity") from exc
    if quantity < 0 or quantity.denominator != 1:
        raise AllocationError(f"{field}={value!r} must be a whole number >= 0")
    return int(quantity)


def _percent(resources: Mapping[str, object], name: str, *, where: str) -> int:
    value = _whole_number(resources, name, where=where)
    if value > _MAX_PERCENT:
        raise AllocationError(
            f"{names.DEVICE_ALLOCATED}: {where}.resources[{name}]={resources.get(name)!r} is above "
            f"{_MAX_PERCENT}; one entry is one GPU, so its share is at most {_MAX_PERCENT}"
        )
    return value


def _mig_uuid(extension: object, *, where: str) -> str:
    if not isinstance(extension, dict):
        # Koordinator's own extension fields are other shapes we do not use.
        return ""
    value = extension.get(names.ALLOCATION_MIG_UUID, "")
    if not isinstance(value, str):
        raise AllocationError(
            f"{names.DEVICE_ALLOCATED}: {where}.extension[{names.ALLOCATION_MIG_UUID}]={value!r} "
            "must be a string MIG UUID"
        )
    return value


def _mig_create(extension: object, *, where: str) -> tuple[str, int]:
    """The MIG instance to create (profile, placement start), ("", -1) when the entry names none."""
    if not isinstance(extension, dict) or names.ALLOCATION_MIG_PROFILE not in extension:
        return "", -1
    profile = extension[names.ALLOCATION_MIG_PROFILE]
    start = extension.get(names.ALLOCATION_MIG_PLACEMENT)
    field = f"{names.DEVICE_ALLOCATED}: {where}.extension"
    if not isinstance(profile, str) or not profile:
        raise AllocationError(f"{field}[{names.ALLOCATION_MIG_PROFILE}]={profile!r} must be a MIG profile name such as 3g.40gb")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise AllocationError(
            f"{field}[{names.ALLOCATION_MIG_PLACEMENT}]={start!r} must be the placement's first memory slice, "
            "an integer >= 0, beside its profile"
        )
    if names.ALLOCATION_MIG_UUID in extension:
        raise AllocationError(
            f"{field}: names both an existing MIG instance ({names.ALLOCATION_MIG_UUID}) and one to create "
            f"({names.ALLOCATION_MIG_PROFILE}); an entry is one or the other"
        )
    return profile, start


def _check_share(share: GPUShare, *, where: str) -> None:
    problems = []
    if share.mig_profile and (share.mig_uuid or share.mig_placement < 0):
        problems.append(
            f"MIG instance to create {share.mig_profile!r} needs a placement >= 0 (got {share.mig_placement}) "
            "and no existing instance uuid"
        )
    if share.minor < 0:
        problems.append(f"minor={share.minor} must be >= 0")
    for field, value in (("core_percent", share.core_percent), ("memory_ratio_percent", share.memory_ratio_percent)):
        if not 0 <= value <= _MAX_PERCENT:
            problems.append(f"{field}={value} must be within 0..{_MAX_PERCENT} (one entry is one GPU)")
    if share.memory_bytes < 0:
        problems.append(f"memory_bytes={share.memory_bytes} must be >= 0")
    for c in share.containers:
        if not (0 <= c.core_percent <= share.core_percent and 0 <= c.memory_ratio_percent <= _MAX_PERCENT
                and c.memory_bytes >= 0):
            problems.append(f"container {c.name!r}: core {c.core_percent}, memory {c.memory_bytes}, ratio "
                            f"{c.memory_ratio_percent} is not a part of the GPU's share")
    limit = share.limit
    if limit is not None and not (
        share.core_percent <= limit.core_percent <= _MAX_PERCENT
        and share.memory_ratio_percent <= limit.memory_ratio_percent <= _MAX_PERCENT
        and limit.memory_bytes >= share.memory_bytes
    ):
        problems.append(f"burstable limit {limit} is below the share's request or above one GPU")
    if len({c.name for c in share.containers}) != len(share.containers):
        problems.append("a container is listed twice")
    if problems:
        raise AllocationError(f"cannot encode allocation {where}: " + "; ".join(problems))


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__
