"""Which MIG instance a single-card share gets: an existing free one, or a new one at a chosen placement.

Pure functions over the node's reported GPUs (`GPUInfo.mig_profiles`, the
instances with their placements) and the allocations counted on the node.

The choice, in order:

1. **An existing free instance that holds the request**, the smallest first: it
   costs no create call and no slice that is not already carved. An instance is
   free when no allocation names it: by UUID (an operator's instance), or by
   profile and placement (one fgpu created, or is about to create).
2. **A new instance**, over every profile that covers the request and every legal
   placement that is free now (apis/mig.py has the rules):
   - fewest compute slices first, then least memory: the least waste;
   - then the placement that keeps the most room for larger profiles: after the
     instance is counted, the node's free placements per profile, largest
     profile first, compared as a vector (more is better). Only profiles a
     memory request can get count (`created_profiles`): 4g.40gb, 2g.20gb and
     the "+me" one are never created, so room for them is worth nothing. So a
     3g on an empty A100 goes to start 4 (slice 7 is no 1g's, so four 1g
     placements stay against three), and a small instance goes to a GPU
     already carved rather than break a GPU that could still hold a 7g;
   - then the lowest GPU slot and start, so equal choices are deterministic.

A GPU with an instance whose placement the agent did not report (an older agent)
gets no new instances: what is free on it is not known.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from apis.allocation import Allocation
from apis.inventory import GPUInfo
from apis.mig import MIGPlacement, MIGProfile, Occupied, free_placements


@dataclass(frozen=True)
class MIGChoice:
    slot: int
    profile: str
    memory_bytes: int
    #: The placement's start (memory slice); -1 for an operator's instance named by UUID.
    placement_start: int
    #: An operator's instance, named by UUID; "" when the node is to create (or re-use) one by placement.
    uuid: str = ""


@dataclass(frozen=True)
class GPUSlot:
    """A GPU in MIG mode the pod may use, with what the node's allocations hold on it."""

    slot: int
    gpu: GPUInfo
    #: MIG instance UUIDs named by allocations (any GPU of the node).
    held_uuids: frozenset[str]
    #: Instances allocations promise by profile and placement on this GPU (created or not yet).
    promised: tuple[Occupied, ...]


def promised_on(gpu: GPUInfo, allocations: Iterable[Allocation]) -> tuple[Occupied, ...]:
    """The instances the allocations ask the node to create (or keep) on `gpu`."""
    by_name = {p.name: p for p in gpu.mig_profiles}
    out = []
    for allocation in allocations:
        for share in allocation.gpus:
            if share.mig_profile and share.uuid == gpu.uuid:
                profile = by_name.get(share.mig_profile)
                size = profile.placements[0].size if profile and profile.placements else 1
                slices = profile.slices if profile else 0
                out.append(Occupied(share.mig_profile, slices, MIGPlacement(share.mig_placement, size)))
    return tuple(out)


def occupied(view: GPUSlot) -> tuple[Occupied, ...] | None:
    """Every instance on the GPU (reported or promised), None when one has no known placement."""
    taken = list(view.promised)
    for instance in view.gpu.mig_instances:
        if instance.placement_size <= 0 or instance.placement_start < 0:
            return None
        placement = MIGPlacement(instance.placement_start, instance.placement_size)
        if not any(o.placement == placement for o in taken):
            taken.append(Occupied(instance.profile, instance.slices, placement))
    return tuple(taken)


def free_instances(view: GPUSlot) -> list[MIGChoice]:
    """Instances that exist and that no allocation holds.

    A GPU instance without a MIG device (uuid "": no compute instance) is never handed out:
    there is nothing a container could open. `occupied` still counts its placement.
    """
    promised = {o.placement.start for o in view.promised}
    out = []
    for instance in view.gpu.mig_instances:
        if not instance.uuid or instance.uuid in view.held_uuids:
            continue
        if instance.fgpu_created:
            if instance.placement_start < 0 or instance.placement_start in promised:
                continue
            out.append(MIGChoice(view.slot, instance.profile, instance.memory_bytes, instance.placement_start))
        else:
            out.append(MIGChoice(view.slot, instance.profile, instance.memory_bytes, -1, instance.uuid))
    return out


def largest_free_memory(view: GPUSlot) -> int:
    """Memory of the largest instance the GPU could give a pod now: a free one, or one it could create."""
    best = max((c.memory_bytes for c in free_instances(view)), default=0)
    taken = occupied(view)
    if taken is not None:
        best = max([best] + [p.memory_bytes for p in view.gpu.mig_profiles if free_placements(p, taken)])
    return best


def choose(views: Sequence[GPUSlot], memory_need: Sequence[int]) -> MIGChoice | None:
    """The instance for a share needing `memory_need[i]` bytes on `views[i]`; None when nothing fits."""
    existing = [
        (c.memory_bytes, c.slot, c.placement_start, c.uuid, c)
        for view, need in zip(views, memory_need, strict=True)
        for c in free_instances(view)
        if c.memory_bytes >= need
    ]
    if existing:
        return min(existing, key=lambda e: e[:4])[4]
    return _new_instance(views, memory_need)


def _new_instance(views: Sequence[GPUSlot], memory_need: Sequence[int]) -> MIGChoice | None:
    layouts = [occupied(v) for v in views]
    wanted = [created_profiles(v.gpu.mig_profiles) for v in views]
    order = _profile_order(wanted)
    base = [_free_counts(w, taken, order) if taken is not None else None for w, taken in zip(wanted, layouts, strict=True)]
    total = [sum(counts[i] for counts in base if counts is not None) for i in range(len(order))]
    best: tuple[tuple[int, ...], MIGChoice] | None = None
    for view, need, taken, counts, mine in zip(views, memory_need, layouts, base, wanted, strict=True):
        if taken is None or counts is None:
            continue
        for profile in view.gpu.mig_profiles:
            if profile.memory_bytes < need:
                continue
            for placement in free_placements(profile, taken):
                after = _free_counts(mine, (*taken, Occupied(profile.name, profile.slices, placement)), order)
                room = tuple(-(t - b + a) for t, b, a in zip(total, counts, after, strict=True))
                key = (profile.slices, profile.memory_bytes, int(profile.media), *room, view.slot, placement.start)
                if best is None or key < best[0]:
                    best = (key, MIGChoice(view.slot, profile.name, profile.memory_bytes, placement.start))
    return best[1] if best else None


def created_profiles(profiles: tuple[MIGProfile, ...]) -> tuple[MIGProfile, ...]:
    """The profiles a memory request can get here: those no other profile of the GPU beats.

    A request gets the covering profile with the fewest slices, then the least memory, then
    no media engines; so a profile is never created when another holds at least its memory and
    ranks before it: fewer slices (3g.40gb beats 4g.40gb, 1g.20gb beats 2g.20gb), or the same
    without "+me" (1g.10gb beats 1g.10gb+me). Keeping room for such a profile costs room for
    the ones pods do get.
    """
    def rank(p: MIGProfile) -> tuple[int, int, bool]:
        return (p.slices, p.memory_bytes, p.media)

    return tuple(
        p for p in profiles
        if not any(q.memory_bytes >= p.memory_bytes and rank(q) < rank(p) for q in profiles)
    )


def _profile_order(wanted: Sequence[tuple[MIGProfile, ...]]) -> list[tuple[int, int, str]]:
    """(slices, memory, name) of every profile the node's GPUs can be asked to create, largest first."""
    seen = {(p.slices, p.memory_bytes, p.name) for profiles in wanted for p in profiles}
    return sorted(seen, reverse=True)


def _free_counts(profiles: tuple[MIGProfile, ...], taken: tuple[Occupied, ...], order: list[tuple[int, int, str]]) -> list[int]:
    by_key = {(p.slices, p.memory_bytes, p.name): p for p in profiles}
    return [len(free_placements(by_key[k], taken)) if k in by_key else 0 for k in order]


# --- why nothing fits (reasons.py words it) ------------------------------------------------------

@dataclass(frozen=True)
class Blocked:
    """Why a GPU can give a share no new instance; reasons.py turns it into words."""

    slot: int
    #: The smallest profile whose memory holds the request; "" when none of the GPU's does.
    profile: str
    #: The instances on the GPU (reported or promised), as "3g.40gb@4", in placement order.
    taken: tuple[str, ...]
    #: The GPU reports no profiles, or an instance without a placement, so none is created there.
    unknown: bool
    #: The largest profile of the GPU, for "no profile holds": its name and memory.
    largest: str = ""
    largest_bytes: int = 0


def blocked(views: Sequence[GPUSlot], memory_need: Sequence[int]) -> list[Blocked]:
    """Why each GPU can create no instance for the share; only meaningful when `choose` gave None."""
    out = []
    for view, need in zip(views, memory_need, strict=True):
        taken = occupied(view)
        profiles = view.gpu.mig_profiles
        largest = max(profiles, key=lambda p: (p.memory_bytes, p.slices), default=None)
        covering = sorted((p for p in profiles if p.memory_bytes >= need), key=lambda p: (p.slices, p.memory_bytes, p.media))
        listed = tuple(f"{o.profile}@{o.placement.start}" for o in sorted(taken or (), key=lambda o: o.placement.start))
        out.append(
            Blocked(
                slot=view.slot,
                profile=covering[0].name if covering else "",
                taken=listed,
                unknown=taken is None or not profiles,
                largest=largest.name if largest else "",
                largest_bytes=largest.memory_bytes if largest else 0,
            )
        )
    return out
