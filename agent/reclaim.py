"""Which burstable pods to evict when a GPU's memory is really needed: the reclaim decision, pure.

Every cycle the adapter (`agent.reclaim_loop`) hands in, per GPU, its memory in use (NVML) and
each pod's share with what its processes use now (NVML processes mapped to pods through cgroups,
`agent.usage`), with the pod's tier, request, limit and priority from its verified allocation. A
GPU is *under pressure* when

* its used memory is at or above the high-water mark (`high_water` x total), or
* a guaranteed share is at risk: the memory still free is less than what the guaranteed pods may
  yet claim within their requests (the sum over them of request - used, where positive).

`decide` runs once per *new* usage sample (`agent.reclaim_samples`): a sample read again is not a
second observation. Pressure counts as lasting when at least two samples show it and they span
`pressure_grace_s` (the first and the latest, with pressure in every sample between). A sample
without the GPU (its NVML read failed, or the GPU is gone) is no data: the GPU's pressure ends there,
and the next sample with pressure starts its grace anew; the adapter ends every GPU's pressure the
same way when the samples stop coming (`forget_pressure`). So one spiked sample, however long it stays
the latest, and two spikes with only errors between never evict.

When the pressure has lasted so and the GPU's cooldown since its last eviction is
over, burstable pods on the GPU are chosen, lowest priority first, then largest overuse (used -
request), then the largest user, until what they use covers the deficit: enough to bring the GPU
back under the mark and to give every guaranteed pod its whole request; a burstable pod that uses
no memory on the GPU is never chosen (it would free nothing). Guaranteed pods are never
chosen, whatever the pressure; a GPU under pressure with no such burstable pod is reported, not
acted on (`Verdict.stuck`). A pod once chosen is not chosen again while it is still there (its
deletion is in flight, or it was refused: `retry_s` later it may be chosen again).

Compute is not reclaimed: the agent does not lower a running process's compute cap (MPS fixes a
client's active thread percentage when it connects; the HAMi-core release read caches its SM limit
per process at start and can only switch throttling on or off at run time, not verified on a GPU),
so a burst of compute is bounded by the scheduler's ratio alone and evictions happen on memory only
(docs/overcommit.md).

Pure: the state between cycles is a frozen value passed in and returned; the clock is an argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ReclaimPolicy:
    """A node pool's reclaim settings (the agent config's `overcommit:` section)."""

    #: fraction of a GPU's memory in use at which burstable pods are evicted
    high_water: float = 0.95
    #: how long pressure must last before anything is evicted (a spike shorter than this is ridden out)
    pressure_grace_s: float = 5.0
    #: after an eviction on a GPU, how long before the next one there (lets the memory come back)
    cooldown_s: float = 30.0
    #: the longest termination grace an evicted pod gets: its own `terminationGracePeriodSeconds` is its
    #: author's choice, so it is capped by this, as kubelet caps it with `evictionMaxPodGracePeriod`
    eviction_grace_s: int = 30
    #: a chosen pod still running after this long may be chosen again (its eviction was refused)
    retry_s: float = 60.0


@dataclass(frozen=True)
class PodOnGPU:
    pod_uid: str
    namespace: str
    name: str
    burstable: bool
    priority: int
    request_bytes: int
    limit_bytes: int
    used_bytes: int
    #: the pod's own `spec.terminationGracePeriodSeconds` (None: not given)
    termination_grace_s: int | None = None

    @property
    def overuse(self) -> int:
        return self.used_bytes - self.request_bytes


#: A deletion with grace 0 is a force delete: the pod object goes at once while its processes still hold
#: the GPU memory, and the scheduler would give its share to a newcomer before the memory is back.
MIN_EVICTION_GRACE_S = 1


def termination_grace_s(policy: ReclaimPolicy, pod: PodOnGPU) -> int:
    """The grace an evicted pod gets: its own, capped by the pool's `eviction_grace_s`, never a force delete."""
    own = pod.termination_grace_s
    grace = policy.eviction_grace_s if own is None else min(own, policy.eviction_grace_s)
    return max(MIN_EVICTION_GRACE_S, grace)


@dataclass(frozen=True)
class GPUMemory:
    uuid: str
    total_bytes: int
    used_bytes: int
    pods: tuple[PodOnGPU, ...] = ()


@dataclass(frozen=True)
class Eviction:
    gpu_uuid: str
    pod: PodOnGPU
    #: why, in words, for the Event and the log
    reason: str


@dataclass(frozen=True)
class ReclaimMemory:
    """What the decision remembers between cycles."""

    #: GPU uuid -> when its current pressure began
    pressure_since: Mapping[str, float] = field(default_factory=dict)
    #: GPU uuid -> how many samples in a row have shown its current pressure
    pressure_samples: Mapping[str, int] = field(default_factory=dict)
    #: GPU uuid -> when it last had a pod evicted
    last_eviction: Mapping[str, float] = field(default_factory=dict)
    #: pod uid -> when it was chosen
    chosen: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    evictions: tuple[Eviction, ...]
    memory: ReclaimMemory
    #: GPUs under pressure with no burstable pod to evict (guaranteed pods alone overfill it)
    stuck: tuple[str, ...] = ()


def deficit(gpu: GPUMemory, policy: ReclaimPolicy) -> tuple[int, str]:
    """Bytes to free on `gpu` now (0: no pressure), and why in words."""
    mark = int(gpu.total_bytes * policy.high_water)
    over = gpu.used_bytes - mark
    free = gpu.total_bytes - gpu.used_bytes
    owed = sum(max(0, p.request_bytes - p.used_bytes) for p in gpu.pods if not p.burstable)
    at_risk = owed - free
    if over < 0 and at_risk <= 0:
        return 0, ""
    mib = 1 << 20
    reasons = []
    if over >= 0:
        reasons.append(
            f"GPU {gpu.uuid} memory in use {gpu.used_bytes // mib} MiB is at or above the high-water mark "
            f"{mark // mib} MiB ({policy.high_water:.0%} of {gpu.total_bytes // mib} MiB)"
        )
    if at_risk > 0:
        reasons.append(
            f"guaranteed pods on GPU {gpu.uuid} may still claim {owed // mib} MiB within their requests, "
            f"only {free // mib} MiB is free"
        )
    return max(over + 1, at_risk, 1), "; ".join(reasons)


def victims(gpu: GPUMemory, need: int, *, skip: frozenset[str] = frozenset()) -> list[PodOnGPU]:
    """Burstable pods to evict, in order, until what they use covers `need` (all there are if it cannot)."""
    ranked = sorted(
        # A pod using nothing frees nothing: evicting it would only hurt it.
        (p for p in gpu.pods if p.burstable and p.used_bytes > 0 and p.pod_uid not in skip),
        key=lambda p: (p.priority, -p.overuse, -p.used_bytes, p.pod_uid),
    )
    chosen: list[PodOnGPU] = []
    freed = 0
    for pod in ranked:
        if freed >= need:
            break
        chosen.append(pod)
        freed += pod.used_bytes
    return chosen


#: Samples that must show a GPU's pressure before it counts as lasting, whatever the grace.
MIN_PRESSURE_SAMPLES = 2


def forget_pressure(memory: ReclaimMemory) -> ReclaimMemory:
    """`memory` with every GPU's pressure ended (no data came): the next pressure waits its whole grace."""
    return replace(memory, pressure_since={}, pressure_samples={})


def decide(gpus: Sequence[GPUMemory], policy: ReclaimPolicy, memory: ReclaimMemory, *, now: float) -> Verdict:
    """The evictions on this new sample of `gpus` (taken at `now`) and what to remember for the next."""
    present = {p.pod_uid for g in gpus for p in g.pods}
    chosen = {uid: at for uid, at in memory.chosen.items() if uid in present and now - at < policy.retry_s}
    sampled = {g.uuid for g in gpus}
    # A GPU missing from this sample has no data: its pressure ends, it does not carry across the gap.
    since = {uuid: at for uuid, at in memory.pressure_since.items() if uuid in sampled}
    seen = {uuid: n for uuid, n in memory.pressure_samples.items() if uuid in sampled}
    last = dict(memory.last_eviction)
    evictions: list[Eviction] = []
    stuck: list[str] = []
    for gpu in gpus:
        need, why = deficit(gpu, policy)
        if need <= 0:
            since.pop(gpu.uuid, None)  # recovered: the next pressure starts its grace anew
            seen.pop(gpu.uuid, None)
            continue
        start = since.setdefault(gpu.uuid, now)
        seen[gpu.uuid] = seen.get(gpu.uuid, 0) + 1
        if now - start < policy.pressure_grace_s or seen[gpu.uuid] < MIN_PRESSURE_SAMPLES:
            continue
        if gpu.uuid in last and now - last[gpu.uuid] < policy.cooldown_s:
            continue
        # Memory already on its way out (pods chosen before, still terminating) counts as freed.
        pending = sum(p.used_bytes for p in gpu.pods if p.pod_uid in chosen)
        if pending >= need:
            continue
        picked = victims(gpu, need - pending, skip=frozenset(chosen))
        if not picked:
            if pending == 0:
                stuck.append(gpu.uuid)
            continue
        for pod in picked:
            chosen[pod.pod_uid] = now
            evictions.append(Eviction(gpu_uuid=gpu.uuid, pod=pod, reason=why))
        last[gpu.uuid] = now
    return Verdict(
        evictions=tuple(evictions),
        memory=replace(memory, pressure_since=since, pressure_samples=seen, last_eviction=last, chosen=chosen),
        stuck=tuple(stuck),
    )
