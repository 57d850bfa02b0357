"""A MIG-only node pool in the openb replay: static pre-partitioning against dynamic placement.

The pool is nodes of 8 A100-SXM4-80GB GPUs in MIG mode (NVIDIA's A100-80GB profiles and
placements, `apis.mig.A100_80GB`; an H100-80GB has the same geometry). The trace's
single-GPU pods arrive in a seeded random order, none leaves (the arrive-only protocol of
docs/simulator.md), and each gets one MIG instance or fails. Multi-GPU pods are left out (MIG
gives a pod one instance: they belong on a whole-GPU pool) and CPU-only pods too; host CPU and
memory are not modelled.

**Shares to profiles.** A pod asking `gpu_milli` of a GPU needs `gpu_milli/1000` of the memory a
7g.80gb instance has (what MIG leaves usable of the card), and is served, as the scheduler serves
it (`apis.mig.covering_profiles`), by a profile whose memory holds that: on the openb default
trace 1000, 810, 650, 590 and 550 map to 7g.80gb; 480..320 to 3g.40gb; 230..140 to 1g.20gb;
110 and 50 to 1g.10gb. The instance's compute slices replace the requested compute (a 470-milli pod gets
3 of 7 slices, 43%). `needed_slices` are the slices of that smallest covering profile; an
instance larger than that (a static layout's, or a larger profile when the smallest has no free
placement) wastes the difference ("internal waste").

**Strategies** (the same pods, the same order):

- `static:<mix>`: every GPU pre-partitioned into a fixed mix of operator instances (`MIXES`);
  the real scheduler core gives each pod the smallest free instance that holds it;
- `first-fit`: dynamic; the smallest covering profile, on the first GPU and lowest placement
  start where it fits (what a placement-blind creator does);
- `fgpu`: dynamic; the real scheduler core (`Scheduler.select` + `reserve`, pods with
  `fgpu.io/gpu-mode: mig`), whose GPU choice is scheduler_plugin/core/mig_placement.py.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from apis.allocation import GPUShare
from apis.devices import GPUInfo, MIGInstance, NodeDevices
from apis.mig import (
    A100_80GB,
    COMPUTE_SLICES,
    MIGMode,
    MIGPlacement,
    MIGProfile,
    Occupied,
    covering_profiles,
    free_placements,
    lay_out,
)
from apis.request import DeviceRequest
from scheduler_plugin.core.api import NodeName, PodRequest, PodUID, SchedulingError
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.trace import MILLI_PER_GPU, TracePod

PROFILES: tuple[MIGProfile, ...] = A100_80GB
BY_NAME = {p.name: p for p in PROFILES}
GPUS_PER_NODE = 8
MODEL = "A100-SXM4-80GB"
#: The memory of the full-GPU profile: what a 1000-milli pod needs.
FULL_MEMORY = max(p.memory_bytes for p in PROFILES)
#: Static mixes, one layout for every GPU. `balanced` is NVIDIA mig-parted's `all-balanced`
#: config for A100-80GB; `halves` two 3g.40gb per GPU; `whole` one 7g.80gb (MIG mode, no sharing).
MIXES: dict[str, tuple[str, ...]] = {
    "balanced": ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
    "halves": ("3g.40gb", "3g.40gb"),
    "whole": ("7g.80gb",),
}
#: The smallest instance: a GPU where it fits no more has stranded its free slices.
_SMALLEST = min(PROFILES, key=lambda p: (p.slices, p.memory_bytes, p.media))


@dataclass(frozen=True)
class PoolPod:
    name: str
    milli: int

    @property
    def memory_bytes(self) -> int:
        return self.milli * FULL_MEMORY // MILLI_PER_GPU

    @property
    def needed_slices(self) -> int:
        """Slices of the smallest profile that holds the pod: what any MIG layout must give it."""
        profile = profile_for(self)
        return profile.slices if profile else COMPUTE_SLICES


@dataclass
class PoolResult:
    strategy: str
    gpus: int
    pods: int
    placed: int = 0
    #: compute slices of the instances given to pods
    allocated_slices: int = 0
    #: slices of the smallest profile that holds each placed pod
    needed_slices: int = 0
    #: free compute slices at the end on GPUs where not even the smallest profile can start
    #: (dynamic), or outside any free instance (static)
    stranded_slices: int = 0
    instances: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def total_slices(self) -> int:
        return self.gpus * COMPUTE_SLICES

    def to_json(self) -> dict[str, object]:
        return {
            "strategy": self.strategy,
            "gpus": self.gpus,
            "pods": self.pods,
            "placed": self.placed,
            "placed_percent": round(100 * self.placed / max(self.pods, 1), 2),
            "allocation_percent": round(100 * self.allocated_slices / max(self.total_slices, 1), 2),
            "needed_percent": round(100 * self.needed_slices / max(self.total_slices, 1), 2),
            "internal_waste_slices": self.allocated_slices - self.needed_slices,
            "free_slices": self.total_slices - self.allocated_slices,
            "stranded_slices": self.stranded_slices,
            "instances": dict(sorted(self.instances.items())),
            "seconds": round(self.seconds, 2),
        }


def pool_pods(pods: Sequence[TracePod], *, seed: int) -> list[PoolPod]:
    """The trace's single-GPU pods in the run's order (a seeded shuffle)."""
    chosen = [PoolPod(p.name, p.gpu_milli) for p in pods if p.num_gpu == 1]
    random.Random(seed).shuffle(chosen)
    return chosen


def pool_size(pods: Sequence[PoolPod], *, load: float) -> int:
    """GPUs (whole nodes) such that the pods ask `load` times the pool's compute slices."""
    slices = sum(p.needed_slices for p in pods)
    nodes = max(1, math.ceil(slices / (load * COMPUTE_SLICES * GPUS_PER_NODE)))
    return nodes * GPUS_PER_NODE


def profile_for(pod: PoolPod) -> MIGProfile | None:
    covering = covering_profiles(PROFILES, pod.memory_bytes)
    return covering[0] if covering else None


def run(strategy: str, pods: Sequence[PoolPod], gpus: int) -> PoolResult:
    """One strategy over the pool; `strategy` is `first-fit`, `fgpu` or `static:<mix>`."""
    started = time.perf_counter()
    if strategy == "first-fit":
        result = _first_fit(pods, gpus)
    elif strategy == "fgpu":
        result = _scheduler(strategy, pods, gpus, static=())
    elif strategy.startswith("static:") and strategy.removeprefix("static:") in MIXES:
        result = _scheduler(strategy, pods, gpus, static=MIXES[strategy.removeprefix("static:")])
    else:
        known = ", ".join(["first-fit", "fgpu", *(f"static:{m}" for m in MIXES)])
        raise ValueError(f"strategy {strategy!r} is not one of {known}")
    result.seconds = time.perf_counter() - started
    return result


def _first_fit(pods: Sequence[PoolPod], gpus: int) -> PoolResult:
    result = PoolResult("first-fit", gpus, len(pods))
    taken: list[list[Occupied]] = [[] for _ in range(gpus)]
    for pod in pods:
        placed = False
        for profile in covering_profiles(PROFILES, pod.memory_bytes):
            for layout in taken:
                free = free_placements(profile, tuple(layout))
                if free:
                    layout.append(Occupied(profile.name, profile.slices, free[0]))
                    _count(result, pod, profile)
                    placed = True
                    break
            if placed:
                break
    result.stranded_slices = sum(_stranded(tuple(layout)) for layout in taken)
    return result


def _stranded(layout: tuple[Occupied, ...]) -> int:
    free = COMPUTE_SLICES - sum(o.slices for o in layout)
    return free if free and not free_placements(_SMALLEST, layout) else 0


def _count(result: PoolResult, pod: PoolPod, profile: MIGProfile) -> None:
    result.placed += 1
    result.allocated_slices += profile.slices
    result.needed_slices += pod.needed_slices
    result.instances[profile.name] = result.instances.get(profile.name, 0) + 1


def _scheduler(strategy: str, pods: Sequence[PoolPod], gpus: int, *, static: tuple[str, ...]) -> PoolResult:
    result = PoolResult(strategy, gpus, len(pods))
    core = Scheduler()
    nodes = [_node(n, static) for n in range(gpus // GPUS_PER_NODE)]
    for devices in nodes:
        core.upsert_node_devices(devices)
    by_uuid = {m.uuid: m for d in nodes for g in d.gpus for m in g.mig_instances}
    held: dict[str, list[GPUShare]] = {}
    for pod in pods:
        request = PodRequest(
            uid=PodUID(pod.name), namespace="trace", name=pod.name, device=_device(pod), mig_mode=MIGMode.MIG
        )
        node = core.select(request)
        if node is None:
            continue
        try:
            allocation = core.reserve(request, node)
        except SchedulingError:
            continue
        core.confirm(request.uid)
        (share,) = allocation.gpus
        profile = BY_NAME[by_uuid[share.mig_uuid].profile if share.mig_uuid else share.mig_profile]
        held.setdefault(share.uuid, []).append(share)
        _count(result, pod, profile)
    for devices in nodes:
        for gpu in devices.gpus:
            mine = held.get(gpu.uuid, [])
            if static:
                # Free instances count as free slices; only slices outside every instance are stranded.
                result.stranded_slices += COMPUTE_SLICES - sum(m.slices for m in gpu.mig_instances)
            else:
                layout = tuple(
                    Occupied(s.mig_profile, BY_NAME[s.mig_profile].slices, _placement(s)) for s in mine
                )
                result.stranded_slices += _stranded(layout)
    return result


def _placement(share: GPUShare) -> MIGPlacement:
    return MIGPlacement(share.mig_placement, BY_NAME[share.mig_profile].placements[0].size)


def _device(pod: PoolPod) -> DeviceRequest:
    # A share of memory only, in bytes: the instance's slices replace compute (docs/mig.md).
    return DeviceRequest(
        gpus=1, core_percent=0, memory_bytes=max(pod.memory_bytes, 1), memory_ratio_percent=None, whole=False,
        source="trace",
    )


def _node(n: int, static: tuple[str, ...]) -> NodeDevices:
    name = f"mig-node-{n:04d}"
    gpus = []
    starts = lay_out(tuple(BY_NAME[p] for p in static)) if static else ()
    if static and starts is None:
        raise ValueError(f"static mix {static} does not fit one GPU")
    for i in range(GPUS_PER_NODE):
        uuid = f"GPU-{name}-{i}"
        instances = tuple(
            MIGInstance(
                uuid=f"MIG-{name}-{i}-{k}", profile=p, memory_bytes=BY_NAME[p].memory_bytes,
                slices=BY_NAME[p].slices, profile_id=BY_NAME[p].profile_id, placement_start=start.start,
                placement_size=start.size, index=k,
            )
            for k, (p, start) in enumerate(zip(static, starts or (), strict=True))
        )
        gpus.append(
            GPUInfo(
                uuid=uuid, minor=i, index=i, model=f"NVIDIA {MODEL}", model_label=MODEL,
                memory_bytes=80 * 2**30, mig_enabled=True, mig_instances=instances,
                # Static: the operator's layout is all there is (no profiles reported, nothing created).
                mig_profiles=() if static else PROFILES,
            )
        )
    return NodeDevices(node_name=NodeName(name), gpus=tuple(gpus))
