"""The node's MIG decisions: what to create for an allocation, what to destroy, what is fgpu's.

Pure functions over plain values; `agent.mig_nvml` reads NVML into them and
carries the actions out.

Which instances are fgpu's (docs/mig.md): an instance is fgpu's when the
node-local record (written by `agent.mig_nvml.OwnedFile` around each create)
lists it with the same GPU, GPU instance id, profile, placement and MIG device
UUID as NVML shows now. Everything else is an operator's, and fgpu never destroys
it. The UUID is what tells fgpu's instance from one an operator made at the very
same place while the agent was down (NVML hands the freed GPU instance id out
again); an entry whose UUID NVML no longer shows is dropped. A record written
before entries carried the UUID proves nothing and is read as empty (leak rather
than destroy).

A create is announced first: an `Intent` (GPU, profile, placement) goes into the
record before NVML is asked, and becomes an `Owned` entry once the instance
exists. An intent found later was left by an agent that stopped mid-create
(`resolve_intents`): an instance of that profile at that placement that the record
does not list yet is the one it made (the placement was free when fgpu asked, or
fgpu would not have asked); with nothing there, the intent is dropped.

A live pod's hold never makes an instance fgpu's, though it keeps fgpu's from
being destroyed or handed to another pod, whether it names the instance by
placement (one the node created for it) or by UUID: a signed allocation naming the place where an operator's
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
    #: Its MIG device UUID; "" only for a GPU instance an interrupted create left without its
    #: compute instance (`resolve_intents`).
    uuid: str

    @classmethod
    def of(cls, instance: Instance) -> Owned:
        """The entry that names `instance` exactly as NVML shows it."""
        return cls(instance.gpu_uuid, instance.gi_id, instance.profile, instance.placement_start, instance.uuid)


@dataclass(frozen=True)
class Intent:
    """A create fgpu is about to ask NVML for, recorded first (the GPU instance id is not known yet)."""

    gpu_uuid: str
    profile: str
    placement_start: int


@dataclass(frozen=True)
class Want:
    """An instance a live pod's verified allocation asks for (or holds).

    By placement (`profile`, `placement_start`): one the node creates for the pod, with `uuid`
    once it exists. By UUID only (`profile` "", `placement_start` -1): an existing instance the
    scheduler named by its MIG device UUID.
    """

    pod_uid: str
    gpu_uuid: str
    profile: str = ""
    placement_start: int = -1
    #: The MIG device UUID the pod holds; "" while the instance it asks for is not made yet.
    uuid: str = ""

    @property
    def by_placement(self) -> bool:
        return bool(self.profile)

    def names(self, instance: Instance) -> bool:
        """Whether this want is a hold on `instance` (by its placement or by its UUID)."""
        if instance.gpu_uuid != self.gpu_uuid:
            return False
        if self.by_placement and instance.placement_start == self.placement_start:
            return True
        return bool(self.uuid) and self.uuid == instance.uuid


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
    return frozenset(entry for i in instances if (entry := Owned.of(i)) in recorded)


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
                out.add(Owned.of(i))
    return frozenset(out)


def for_allocation(
    want: Want, instances: Iterable[Instance], owned: frozenset[Owned], live: Iterable[Want]
) -> Create | Use | Refuse:
    """What to do before the pod's container starts.

    `live`: every live pod's wants (this pod's are skipped). Another pod that holds the placement,
    or holds by UUID the instance sitting there, keeps it: the want is refused.
    """
    there = next(
        (i for i in instances if i.gpu_uuid == want.gpu_uuid and i.placement_start == want.placement_start), None
    )
    for other in live:
        if other.pod_uid == want.pod_uid or other.gpu_uuid != want.gpu_uuid:
            continue
        by_place = other.by_placement and other.placement_start == want.placement_start
        if by_place or (there is not None and other.names(there)):
            how = "" if by_place else f" (MIG instance {there.uuid if there else ''}, by its UUID)"
            return Refuse(
                f"MIG placement {want.profile} at memory slice {want.placement_start} of GPU {want.gpu_uuid} "
                f"is held by pod {other.pod_uid}{how}; the scheduler will see it taken in the next report"
            )
    if there is None:
        return Create(want)
    mine = Owned.of(there) in owned
    if there.profile == want.profile and mine and there.uuid:
        return Use(there)
    whose = "fgpu's" if mine else "an operator's"
    return Refuse(
        f"MIG placement {want.placement_start} of GPU {want.gpu_uuid} holds {whose} {there.profile} instance "
        f"(GPU instance {there.gi_id}), not a free place for {want.profile}; the scheduler will see it in the next report"
    )


def to_destroy(
    instances: Iterable[Instance],
    owned: frozenset[Owned],
    wants: Iterable[Want],
    *,
    scope: Iterable[Want] | None = None,
) -> list[Destroy]:
    """fgpu's instances no live pod holds (by placement or by UUID) and nothing runs on; never an operator's.

    `scope`: only the instances these wants name are considered (a stopped pod's, when the node
    cannot list every live pod); None: all of them.
    """
    wants = list(wants)
    within = None if scope is None else list(scope)
    out = []
    for i in instances:
        if Owned.of(i) not in owned:
            continue
        if within is not None and not any(w.names(i) for w in within):
            continue
        if any(w.names(i) for w in wants):
            continue
        if i.busy:
            continue  # a process still runs on it: kept until the next pass finds it idle
        out.append(Destroy(i, "no live pod holds it"))
    return out
