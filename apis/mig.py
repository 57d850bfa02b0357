"""MIG as plain values: profiles, placements, NVIDIA's tables, and which requests MIG serves.

A GPU in MIG mode is carved into GPU instances. Each instance has a *profile*
("3g.40gb": 3 of 7 compute slices, 40 GB) and a *placement*: the run of the
GPU's 8 memory slices it occupies, written `start:size` as
`nvmlDeviceGetGpuInstancePossiblePlacements` gives it. Two instances may not
share a memory slice, and NVML allows each profile only at fixed starts, so
where an instance sits decides what fits next: on an A100, a 3g at start 0
blocks the only 4g placement ({0}:4), a 3g at start 4 does not.

The agent reads profiles and placements from NVML and reports them per GPU
(`apis.inventory.GPUInfo.mig_profiles`); the scheduler works from the report.
The tables below are NVIDIA's (MIG user guide, "Supported MIG Profiles", and
the `nvidia-smi mig -lgip` / `-lgipp` listings of "Getting Started with MIG";
docs/mig.md cites them). Only the fake NVML, tests and the simulator read them:
a real node's numbers come from its driver.

Example profile as it travels in the Device extras::

    {"name":"3g.40gb","profileID":9,"slices":3,"memoryBytes":42144366592,"instanceCount":2,
     "multiprocessors":42,"copyEngines":3,"decoders":2,"jpegs":0,"ofas":0,
     "placements":[{"start":0,"size":4},{"start":4,"size":4}]}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from apis import names
from apis.quoting import quoted

_MIB = 2**20
#: Memory slices of an A100/H100 (placements index them, 0..7).
MEMORY_SLICES = 8
#: Compute slices of an A100/H100 (the "N" of "Ng" adds up to at most this).
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MIGPlacement:
    """Where a GPU instance sits: memory slices start .. start+size-1 (nvmlGpuInstancePlacement_t)."""

    start: int
    size: int

    def overlaps(self, other: MIGPlacement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class MIGProfile:
    """One GPU instance profile of a GPU (nvmlGpuInstanceProfileInfo_v2_t plus its possible placements)."""

    name: str
    #: NVML's profile id (info.id: 19 for 1g.10gb), what placement and create calls take.
    profile_id: int
    #: Compute slices (info.sliceCount).
    slices: int
    memory_bytes: int
    #: How many instances of it one GPU can hold (info.instanceCount).
    instance_count: int
    placements: tuple[MIGPlacement, ...] = ()
    multiprocessors: int = 0
    copy_engines: int = 0
    decoders: int = 0
    jpegs: int = 0
    ofas: int = 0
    #: NVML_GPU_INSTANCE_PROFILE_* index that nvmlDeviceGetGpuInstanceProfileInfo takes (-1: unknown).
    nvml_index: int = -1

    @property
    def media(self) -> bool:
        """A "+me" profile: the one instance that gets the media engines."""
        return self.name.endswith("+me")


class MIGMode(Enum):
    """What a pod's `fgpu.io/gpu-mode` annotation asks for."""

    #: No annotation: a regular share, or a MIG instance when no regular GPU fits.
    ANY = ""
    #: Only a MIG instance (hardware isolation).
    MIG = "mig"
    #: Never a MIG instance.
    SHARED = "shared"


class MIGRequestError(ValueError):
    """A pod's MIG choice that cannot be honoured; the message names the field, value and fix."""


def mig_mode(annotations: Mapping[str, str]) -> MIGMode:
    """The pod's MIG choice; raises MIGRequestError for a value that is not one."""
    raw = annotations.get(names.GPU_MODE, "")
    for mode in MIGMode:
        if raw == mode.value:
            return mode
    raise MIGRequestError(
        f"annotation {names.GPU_MODE}={quoted(raw)} is not a GPU mode; write {MIGMode.MIG.value!r} "
        f"(a MIG instance only), {MIGMode.SHARED.value!r} (never MIG) or leave it out (either)"
    )


def check_mig_request(mode: MIGMode, *, cards: int, whole: bool) -> None:
    """MIG serves single-card shares only: one instance per pod, never a whole GPU (`cards` 0: no GPU asked)."""
    if mode is not MIGMode.MIG:
        return
    if cards == 0:
        raise MIGRequestError(
            f"annotation {names.GPU_MODE}={mode.value!r} asks for a MIG instance, but the pod asks for no GPU; "
            f"add the memory the instance must hold ({names.GPU_MEMORY}, e.g. 20Gi) or drop the annotation"
        )
    if whole:
        raise MIGRequestError(
            f"annotation {names.GPU_MODE}={mode.value!r} asks for a MIG instance, but the pod asks for whole GPUs; "
            f"drop the annotation, or ask for a share ({names.GPU_MEMORY}) that a MIG profile holds"
        )
    if cards != 1:
        raise MIGRequestError(
            f"annotation {names.GPU_MODE}={mode.value!r} asks for a MIG instance, but the pod spreads its share over "
            f"{cards} cards ({names.GPU_SHARED}={cards}); a pod gets one MIG instance, so set {names.GPU_SHARED}=1"
        )


def pod_mig_mode(annotations: Mapping[str, str], *, cards: int | None, whole: bool) -> MIGMode:
    """The pod's checked MIG choice: `mig_mode`, then `check_mig_request` against its GPU request
    (`cards` None: the request itself is invalid, so only the value is checked). The one call the
    scheduler (scheduler_plugin/core/podrequest.py) and the admission check (apis/pod_check.py) share."""
    mode = mig_mode(annotations)
    if cards is not None:
        check_mig_request(mode, cards=cards, whole=whole)
    return mode


def mode_request_key(gpu_uuid: str) -> str:
    """The Node annotation that asks the agent to switch GPU `gpu_uuid` into or out of MIG mode."""
    return f"{names.MIG_MODE_REQUEST_PREFIX}{gpu_uuid}"


def mode_requests(annotations: Mapping[str, str]) -> dict[str, bool]:
    """GPU UUID -> MIG mode wanted (True: enabled), from a Node's annotations; other values are ignored."""
    wanted = {names.MIG_MODE_ENABLED: True, names.MIG_MODE_DISABLED: False}
    return {
        key.removeprefix(names.MIG_MODE_REQUEST_PREFIX): wanted[value]
        for key, value in annotations.items()
        if key.startswith(names.MIG_MODE_REQUEST_PREFIX) and value in wanted
    }


def covering_profiles(profiles: tuple[MIGProfile, ...], memory_bytes: int) -> tuple[MIGProfile, ...]:
    """The profiles whose memory holds `memory_bytes`, smallest first (fewest slices, then memory).

    This is the rule for which requests MIG serves: a single-card share whose memory a
    profile covers. The instance's compute slices replace the requested core percent
    (MIG cannot split finer, and no software limit applies inside an instance).
    """
    fitting = [p for p in profiles if p.memory_bytes >= memory_bytes]
    return tuple(sorted(fitting, key=lambda p: (p.slices, p.memory_bytes, p.media, p.name)))


# --- NVIDIA's tables ------------------------------------------------------------------------

def _p(
    name: str, pid: int, index: int, slices: int, mib: int, count: int, starts: tuple[int, ...], size: int,
    sm: int, ce: int, dec: int, jpeg: int, ofa: int,
) -> MIGProfile:
    return MIGProfile(
        name=name, profile_id=pid, slices=slices, memory_bytes=mib * _MIB, instance_count=count,
        placements=tuple(MIGPlacement(s, size) for s in starts), multiprocessors=sm, copy_engines=ce,
        decoders=dec, jpegs=jpeg, ofas=ofa, nvml_index=index,
    )


_ALL = (0, 1, 2, 3, 4, 5, 6)
# NVML_GPU_INSTANCE_PROFILE_* indices: 1_SLICE 0, 2_SLICE 1, 3_SLICE 2, 4_SLICE 3, 7_SLICE 4,
# 1_SLICE_REV1 (the +me one) 7, 1_SLICE_REV2 (1g with two memory slices) 9.
#: A100-SXM4-40GB / A100-PCIE-40GB.
A100_40GB = (
    _p("1g.5gb", 19, 0, 1, 4864, 7, _ALL, 1, 14, 1, 0, 0, 0),
    _p("1g.5gb+me", 20, 7, 1, 4864, 1, _ALL, 1, 14, 1, 1, 1, 1),
    _p("1g.10gb", 15, 9, 1, 9856, 4, (0, 2, 4, 6), 2, 14, 1, 1, 0, 0),
    _p("2g.10gb", 14, 1, 2, 9856, 3, (0, 2, 4), 2, 28, 2, 1, 0, 0),
    _p("3g.20gb", 9, 2, 3, 19968, 2, (0, 4), 4, 42, 3, 2, 0, 0),
    _p("4g.20gb", 5, 3, 4, 19968, 1, (0,), 4, 56, 4, 2, 0, 0),
    _p("7g.40gb", 0, 4, 7, 40192, 1, (0,), 8, 98, 7, 5, 1, 1),
)
#: A100-SXM4-80GB / A100-PCIE-80GB: the same geometry, twice the memory.
A100_80GB = (
    _p("1g.10gb", 19, 0, 1, 9856, 7, _ALL, 1, 14, 1, 0, 0, 0),
    _p("1g.10gb+me", 20, 7, 1, 9856, 1, _ALL, 1, 14, 1, 1, 1, 1),
    _p("1g.20gb", 15, 9, 1, 19968, 4, (0, 2, 4, 6), 2, 14, 1, 1, 0, 0),
    _p("2g.20gb", 14, 1, 2, 19968, 3, (0, 2, 4), 2, 28, 2, 1, 0, 0),
    _p("3g.40gb", 9, 2, 3, 40192, 2, (0, 4), 4, 42, 3, 2, 0, 0),
    _p("4g.40gb", 5, 3, 4, 40192, 1, (0,), 4, 56, 4, 2, 0, 0),
    _p("7g.80gb", 0, 4, 7, 80896, 1, (0,), 8, 98, 7, 5, 1, 1),
)
#: H100-SXM5-80GB / H100-PCIE-80GB: A100's geometry, Hopper's engines.
H100_80GB = (
    _p("1g.10gb", 19, 0, 1, 9984, 7, _ALL, 1, 16, 1, 1, 1, 0),
    _p("1g.10gb+me", 20, 7, 1, 9984, 1, _ALL, 1, 16, 1, 1, 1, 1),
    _p("1g.20gb", 15, 9, 1, 20096, 4, (0, 2, 4, 6), 2, 26, 1, 1, 1, 0),
    _p("2g.20gb", 14, 1, 2, 20096, 3, (0, 2, 4), 2, 32, 2, 2, 2, 0),
    _p("3g.40gb", 9, 2, 3, 40448, 2, (0, 4), 4, 60, 3, 3, 3, 0),
    _p("4g.40gb", 5, 3, 4, 40448, 1, (0,), 4, 64, 4, 4, 4, 0),
    _p("7g.80gb", 0, 4, 7, 81152, 1, (0,), 8, 132, 8, 7, 7, 1),
)


def profiles_for_model(model: str, memory_bytes: int) -> tuple[MIGProfile, ...]:
    """NVIDIA's profile table for a GPU named `model` (NVML's name), () for one without a table here."""
    gib = memory_bytes / 2**30
    if "A100" in model:
        return A100_40GB if gib <= 48 else A100_80GB
    # 80 GB H100s report ~79.6 GiB; the 94 GB (NVL) and 96 GB ones (~93.6 / ~95 GiB) have other
    # profiles (1g.12gb .. 7g.94gb) and no table here, so the bound sits between them.
    if "H100" in model and gib <= 88:
        return H100_80GB
    return ()


# --- geometry: what one more instance may take ------------------------------------------------

@dataclass(frozen=True)
class Occupied:
    """A GPU instance that exists (or is promised to a pod): its profile's name and slices, and where it sits."""

    profile: str
    slices: int
    placement: MIGPlacement


class Misfit(Enum):
    """Why an instance cannot go at a placement; the fake NVML answers each with NVML's error."""

    #: The profile is never allowed there (NVML_ERROR_INVALID_ARGUMENT).
    ILLEGAL = "not a legal placement of the profile"
    #: The memory slices are taken (NVML_ERROR_INSUFFICIENT_RESOURCES).
    OVERLAP = "overlaps an existing instance"
    #: Not enough compute slices left (NVML_ERROR_INSUFFICIENT_RESOURCES).
    COMPUTE = "not enough compute slices left"
    #: The GPU holds as many of the profile (or instances at all) as it can (NVML_ERROR_INSUFFICIENT_RESOURCES).
    COUNT = "no more instances of the profile"


def misfit(
    profile: MIGProfile, placement: MIGPlacement, occupied: tuple[Occupied, ...], *, max_instances: int = COMPUTE_SLICES
) -> Misfit | None:
    """None when `profile` may be created at `placement` beside `occupied`, else why not."""
    if placement not in profile.placements:
        return Misfit.ILLEGAL
    if any(o.placement.overlaps(placement) for o in occupied):
        return Misfit.OVERLAP
    if sum(o.slices for o in occupied) + profile.slices > COMPUTE_SLICES:
        return Misfit.COMPUTE
    if len(occupied) >= max_instances or sum(1 for o in occupied if o.profile == profile.name) >= profile.instance_count:
        return Misfit.COUNT
    return None


def free_placements(profile: MIGProfile, occupied: tuple[Occupied, ...]) -> tuple[MIGPlacement, ...]:
    """The placements of `profile` where an instance could be created now."""
    return tuple(p for p in profile.placements if misfit(profile, p, occupied) is None)


def lay_out(wanted: tuple[MIGProfile, ...]) -> tuple[MIGPlacement, ...] | None:
    """Placements for `wanted` (in order) that fit together on one empty GPU, None when none do.

    The first such layout in placement order, found by backtracking (at most 7 instances).
    """
    chosen: list[Occupied] = []

    def place(i: int) -> bool:
        if i == len(wanted):
            return True
        profile = wanted[i]
        for p in free_placements(profile, tuple(chosen)):
            chosen.append(Occupied(profile.name, profile.slices, p))
            if place(i + 1):
                return True
            chosen.pop()
        return False

    return tuple(o.placement for o in chosen) if place(0) else None
