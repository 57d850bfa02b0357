"""Which container of a pod gets which of the pod's GPUs, and how much of each.

Koordinator's allocation is per pod: the scheduler places the pod's summed
request (Kubernetes' effective-request rule). Limits, though, are applied per
container, and a container that asked for no GPU must see none. So the
scheduler, which has the pod spec, splits the pod's shares among the containers
that asked, and records the split in the signed allocation
(`names.ALLOCATION_CONTAINERS`); the node only reads it.

The rule, per container:
- a container sees GPUs only if it requested GPU resources itself;
- it gets its request's number of cards, each with its own request's share;
- app containers and sidecars (restartable init containers) run together, so
  their parts of one card add up to at most the pod's share of it;
- a plain init container runs alone beside the sidecars declared before it,
  so it may reuse what the app containers get later.

Pure: no I/O; the scheduler passes each GPU's memory size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from apis.allocation import Allocation, ContainerShare, GPUShare, share_memory_bytes
from apis.device_request import ContainerRequest, DeviceRequest
from apis.pods import ContainerKind

_FULL = 100


class SplitError(ValueError):
    """The containers' requests cannot be laid over the pod's shares."""


@dataclass
class _Room:
    """What is left of one card of the pod's allocation while containers are laid on it."""

    index: int
    core: int
    memory: int


def split_allocation(
    allocation: Allocation, containers: Sequence[ContainerRequest], *, gpu_memory: Mapping[str, int]
) -> Allocation:
    """`allocation` with each share naming the containers that see it and their parts.

    `containers`: the pod's GPU-requesting containers (`apis.request.container_requests`),
    init containers first in spec order. `gpu_memory`: GPU UUID -> its memory in bytes.
    Raises SplitError when the requests do not fit the shares, naming the container.
    """
    if not allocation.gpus or not containers:
        return allocation
    totals = [_total_memory(share, gpu_memory) for share in allocation.gpus]
    parts: dict[int, list[ContainerShare]] = {i: [] for i in range(len(allocation.gpus))}

    def full_rooms() -> list[_Room]:
        return [
            _Room(i, s.core_percent, share_memory_bytes(s, gpu_memory_bytes=totals[i]))
            for i, s in enumerate(allocation.gpus)
        ]

    # Everything that runs for the pod's lifetime shares the cards.
    running = [c for c in containers if c.kind is not ContainerKind.INIT]
    together = full_rooms()
    for c in sorted(running, key=lambda c: (-c.request.gpus, -c.request.core_percent)):
        _place(c, together, allocation, totals, parts)
    # Each plain init container runs alone, beside the sidecars declared before it.
    sidecars_before: list[ContainerRequest] = []
    for c in containers:
        if c.kind is ContainerKind.SIDECAR:
            sidecars_before.append(c)
        elif c.kind is ContainerKind.INIT:
            rooms = full_rooms()
            for sidecar in sidecars_before:
                for i, shares in parts.items():
                    for part in shares:
                        if part.name == sidecar.name:
                            rooms[i].core -= part.core_percent
                            rooms[i].memory -= part.memory_bytes
            _place(c, rooms, allocation, totals, parts)
    return Allocation(gpus=tuple(
        replace(share, containers=tuple(sorted(parts[i], key=lambda p: p.name)))
        for i, share in enumerate(allocation.gpus)
    ))


def _place(
    c: ContainerRequest,
    rooms: list[_Room],
    allocation: Allocation,
    totals: Sequence[int],
    parts: dict[int, list[ContainerShare]],
) -> None:
    request = c.request
    if request.core_percent == 0 and any(
        allocation.gpus[r.index].core_percent > 0 and not allocation.gpus[r.index].mig_uuid for r in rooms
    ):
        # Backends read a 0% compute limit as "no limit": beside containers with a compute share,
        # a memory-only container would take the whole card's compute.
        raise SplitError(
            f"container {c.name!r} asks for GPU memory only, on cards where the pod also asks for compute; it would "
            "run with no compute limit at all: give it a gpu-core request too (its own share of the card's compute)"
        )
    fitting = []
    for room in rooms:
        core, memory, _ = _need(request, totals[room.index])
        share = allocation.gpus[room.index]
        # A MIG instance is enforced by the hardware for the whole pod; only its count matters.
        if share.mig_uuid or (core <= room.core and memory <= room.memory):
            fitting.append(room)
    if len(fitting) < request.gpus:
        have = ", ".join(f"gpu[{r.index}] {r.core}% and {r.memory} bytes left" for r in rooms)
        raise SplitError(
            f"container {c.name!r} asks for {request.gpus} GPU(s) of {request.core_percent}% each, but the "
            f"pod's allocation has only {len(fitting)} card(s) with room for it ({have}); the containers' "
            "requests must fit together on the pod's cards: give containers that share a card shares that "
            "add up to at most one GPU"
        )
    # Best fit: the fullest cards that still take it, so larger containers keep whole cards.
    fitting.sort(key=lambda r: (r.core, r.memory, r.index))
    for room in fitting[: request.gpus]:
        core, memory, ratio = _need(request, totals[room.index])
        room.core -= core
        room.memory -= memory
        parts[room.index].append(ContainerShare(
            name=c.name, core_percent=core, memory_bytes=memory, memory_ratio_percent=ratio
        ))


def _need(request: DeviceRequest, total: int) -> tuple[int, int, int]:
    """(core percent, memory bytes, memory ratio) one card of `request` takes on a card of `total` bytes."""
    if request.whole:
        return _FULL, total, _FULL
    memory = request.memory_bytes_on(total)
    if request.memory_ratio_percent is not None:
        ratio = request.memory_ratio_percent
    else:
        ratio = min(_FULL, -((-memory * _FULL) // max(total, 1)))
    return request.core_percent, memory, ratio


def _total_memory(share: GPUShare, gpu_memory: Mapping[str, int]) -> int:
    total = gpu_memory.get(share.uuid)
    if total is None:
        raise SplitError(f"GPU {share.uuid or f'minor {share.minor}'}: its memory size is not known")
    return total

