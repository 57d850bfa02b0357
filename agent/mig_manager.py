"""The node's MIG decisions: what to create for an allocation, what to destroy, what is fgpu's.

Pure functions over plain values; `agent.mig_nvml` reads NVML into them and
carries the actions out.

Which instances are fgpu's (docs/mig.md): an instance is fgpu's when the
node-local record (written by `agent.mig_nvml.OwnedFile` around each create)
lists it with the same GPU, GPU instance id, profile and placement as NVML shows
now. Everything else is an operator's, and fgpu never destroys it. A record entry
NVML no longer shows is dropped; one whose profile or placement differs from what
NVML shows is not trusted (the GPU instance id was reused by someone else).

A create is announced first: an `Intent` (GPU, profile, placement) goes into the
record before NVML is asked, and becomes an `Owned` entry once the instance
exists. An intent found later was left by an agent that stopped mid-create
(`resolve_intents`): an instance of that profile at that placement that the record
does not list yet is the one it made (the placement was free when fgpu asked, or
fgpu would not have asked); with nothing there, the intent is dropped.

A live pod's allocation never makes an instance fgpu's, though it keeps fgpu's
from being destroyed: a signed allocation naming the place where an operator's
instance sits (a scheduler that had not seen it yet) must be refused, not hand
that instance to the pod and have fgpu destroy it once the pod is gone. So a lost
record makes fgpu leak its idle instances, never take an operator's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Instance:
    """A GPU instance as NVML shows it now."""

    gpu_uuid: str
    gi_id: int
    profile: str
    placement_start: int
    #: UUID of its MIG device (its compute instance); "" when it has no compute instance.
    uuid: str = ""
    #: Processes run on it (NVML's running-process list names its GPU instance).
    busy: bool = False


@dataclass(frozen=True)
class Owned:
    """An entry of fgpu's record of what it created."""

    gpu_uuid: str
    gi_id: int
    profile: str
    placement_start: int


@dataclass(frozen=True)
class Intent:
    """A create fgpu is about to ask NVML for, recorded first (the GPU instance id is not known yet)."""

    gpu_uuid: str
    profile: str
    placement_start: int


@dataclass(frozen=True)
class Want:
    """An instance a live pod's verified allocation asks for."""

    pod_uid: str
    gpu_uuid: str
    profile: str
    placement_start: int


@dataclass(frozen=True)
class Create:
    want: Want


@dataclass(frozen=True)
class Use:
    """The instance exists, is fgpu's and is free: the pod gets it as it is."""

    instance: Instance


@dataclass(frozen=True)
class Refuse:
    """The container must not start; `reason` says why, for the pod's events and the scheduler."""

    reason: str


@dataclass(frozen=True)
class Destroy:
    instance: Instance
    reason: str


def owned_now(instances: Iterable[Instance], record: Iterable[Owned]) -> frozenset[Owned]:
    """fgpu's instances among `instances`: the record's entries NVML confirms."""
    recorded = set(record)
    return frozenset(
        entry for i in instances if (entry := Owned(i.gpu_uuid, i.gi_id, i.profile, i.placement_start)) in recorded
    )


def resolve_intents(instances: Iterable[Instance], recorded: Iterable[Owned], intents: Iterable[Intent]) -> frozenset[Owned]:
    """The record entries an interrupted create left as intents: the instance each one made, if any.

    `instances`: what NVML shows now on the intents' GPUs. An intent whose placement holds an
    instance of its profile that the record does not list yet names fgpu's instance; one with
    nothing there (the agent stopped before NVML created it, or NVML refused) yields nothing.
    """
    known = {(o.gpu_uuid, o.gi_id) for o in recorded}
    out = set()
    for intent in intents:
        for i in instances:
            if (i.gpu_uuid, i.placement_start, i.profile) != (intent.gpu_uuid, intent.placement_start, intent.profile):
                continue
            if (i.gpu_uuid, i.gi_id) not in known:
                out.add(Owned(i.gpu_uuid, i.gi_id, i.profile, i.placement_start))
    return frozenset(out)


def for_allocation(
    want: Want, instances: Iterable[Instance], owned: frozenset[Owned], holders: dict[tuple[str, int], str]
) -> Create | Use | Refuse:
    """What to do before the pod's container starts. `holders`: (GPU, placement start) -> pod already using it."""
    holder = holders.get((want.gpu_uuid, want.placement_start), want.pod_uid)
    if holder != want.pod_uid:
        return Refuse(
            f"MIG placement {want.profile} at memory slice {want.placement_start} of GPU {want.gpu_uuid} "
            f"is held by pod {holder}; the scheduler will see it taken in the next report"
        )
    for i in instances:
        if i.gpu_uuid != want.gpu_uuid or i.placement_start != want.placement_start:
            continue
        mine = Owned(i.gpu_uuid, i.gi_id, i.profile, i.placement_start) in owned
        if i.profile == want.profile and mine and i.uuid:
            return Use(i)
        whose = "fgpu's" if mine else "an operator's"
        return Refuse(
            f"MIG placement {want.placement_start} of GPU {want.gpu_uuid} holds {whose} {i.profile} instance "
            f"(GPU instance {i.gi_id}), not a free place for {want.profile}; the scheduler will see it in the next report"
        )
    return Create(want)


def to_destroy(
    instances: Iterable[Instance],
    owned: frozenset[Owned],
    wants: Iterable[Want],
    *,
    scope: Iterable[Want] | None = None,
) -> list[Destroy]:
    """fgpu's instances no live pod asks for and nothing runs on; never an operator's.

    `scope`: only the instances at these wants' placements are considered (a stopped pod's,
    when the node cannot list every live pod); None: all of them.
    """
    wanted = {(w.gpu_uuid, w.placement_start) for w in wants}
    within = None if scope is None else {(w.gpu_uuid, w.placement_start) for w in scope}
    out = []
    for i in instances:
        if Owned(i.gpu_uuid, i.gi_id, i.profile, i.placement_start) not in owned:
            continue
        if within is not None and (i.gpu_uuid, i.placement_start) not in within:
            continue
        if (i.gpu_uuid, i.placement_start) in wanted:
            continue
        if i.busy:
            continue  # a process still runs on it: kept until the next pass finds it idle
        out.append(Destroy(i, "no live pod holds it"))
    return out
