"""The per-share checks of the GPU hook's decision (`agent.hook.decide`), pure like it.

Each answers "" when the share may be given, or the reason it may not, in words a person can act
on: the share's GPU on this node, what other pods hold on it (GPUHeld, from the admission
ledger), MIG instances to use or to create, and the rule that a memory-only share (0% compute,
no compute limit) and other pods' compute never share a card (docs/isolation.md).
"""

from __future__ import annotations

from agent.admissions import GPUHeld
from apis import names
from apis.allocation import GPUShare
from apis.devices import GPUInfo, NodeDevices
from apis.mig import MIGProfile

_MAX_PERCENT = 100


def memory_only(share: GPUShare) -> bool:
    """A share of the whole GPU that runs with no compute limit: 0% compute (HAMi-core reads
    CUDA_DEVICE_SM_LIMIT=0 as no limit, MPS leaves the active thread percentage at 100) and no
    burstable compute limit either (`burst.with_limit` caps it at that)."""
    return share.core_percent == 0 and (share.limit is None or share.limit.core_percent == 0)


def mixed_card(uuid: str, core: int, *, memory_only: bool, others: GPUHeld) -> str:
    """Why this pod's share of `uuid` may not join what other admitted pods hold there; "" when it may.

    A memory-only share would take the compute the others reserved; a compute share would have
    its compute taken by a memory-only share already there (docs/isolation.md).
    """
    if memory_only and others.core_percent > 0:
        return (
            f"GPU {uuid}: this pod's share is GPU memory only (0% compute, which the isolation backend reads as "
            f"no compute limit), but {pods_text(others.pods - others.memory_only_pods)} hold "
            f"{others.core_percent}% of the card's "
            "compute, which it would take; a memory-only share goes only on a card without compute reservations: "
            f"the pod must ask for a compute share too ({names.GPU_CORE}), or be scheduled again"
        )
    if core > 0 and others.memory_only_pods:
        return (
            f"GPU {uuid}: this pod's {core}% of compute would share the card with the memory-only share of "
            f"{pods_text(others.memory_only_pods)}, which runs with no compute limit and could take it; "
            "the scheduler's view of the node is out of date, the pod must be scheduled again"
        )
    return ""


def find_gpu(share: GPUShare, devices: NodeDevices) -> tuple[GPUInfo | None, str]:
    if share.uuid:
        gpu = next((g for g in devices.gpus if g.uuid == share.uuid), None)
        if gpu is None:
            return None, f"GPU {share.uuid} is not on this node; the pod must be scheduled again"
        if gpu.minor != share.minor:
            return None, (
                f"GPU {share.uuid} has minor {gpu.minor} here but the allocation says minor {share.minor}; "
                "the allocation is stale, the pod must be scheduled again"
            )
        return gpu, ""
    gpu = next((g for g in devices.gpus if g.minor == share.minor), None)
    if gpu is None:
        return None, f"no GPU with minor {share.minor} (/dev/nvidia{share.minor}) on this node"
    return gpu, ""


def held_elsewhere(gpu: GPUInfo, devices: NodeDevices, pod_uid: str) -> str:
    for h in devices.external_holders:
        if h.gpu_uuid == gpu.uuid and h.pod_uid != pod_uid:
            return (
                f"the GPU is held by pod {h.pod_uid} through {h.resource_name or 'another device plugin'}; "
                "it cannot be shared with fgpu pods"
            )
    return ""


def check_share(share: GPUShare, gpu: GPUInfo, *, seen_mig: set[str]) -> str:
    if not gpu.healthy:
        return f"GPU is unhealthy ({gpu.health_reason or 'unknown reason'}); the pod must be scheduled on a healthy GPU"
    if share.mig_profile:
        return check_mig_create(share, gpu, seen_mig=seen_mig)
    if share.mig_uuid:
        if not gpu.mig_enabled:
            return f"MIG instance {share.mig_uuid} asked for, but the GPU is not in MIG mode"
        if not any(m.uuid == share.mig_uuid for m in gpu.mig_instances):
            return f"MIG instance {share.mig_uuid} does not exist on it (MIG layout changed?)"
        if share.mig_uuid in seen_mig:
            return f"MIG instance {share.mig_uuid} is listed twice"
        return ""
    if gpu.mig_enabled:
        return "the GPU is in MIG mode, so only its MIG instances can be allocated, not a share of the whole GPU"
    if not 0 <= share.core_percent <= _MAX_PERCENT:
        return f"core {share.core_percent}% is outside 0..100"
    if share.memory_bytes > gpu.memory_bytes:
        return f"memory {share.memory_bytes} bytes is more than the GPU's {gpu.memory_bytes}"
    return ""


def check_mig_create(share: GPUShare, gpu: GPUInfo, *, seen_mig: set[str]) -> str:
    """A MIG instance the node is to create: the GPU must offer the profile at that placement."""
    what = f"MIG instance {share.mig_profile} at memory slice {share.mig_placement}"
    if not gpu.mig_enabled:
        return f"{what} asked for, but the GPU is not in MIG mode; the pod must be scheduled again"
    profile = mig_profile(gpu, share.mig_profile)
    if profile is None:
        offered = ", ".join(p.name for p in gpu.mig_profiles) or "none reported"
        return f"{what} asked for, but the GPU offers no such profile (it offers: {offered}); the pod must be scheduled again"
    if not any(p.start == share.mig_placement for p in profile.placements):
        starts = ", ".join(str(p.start) for p in profile.placements) or "none"
        return f"{what} asked for, but {share.mig_profile} can start only at memory slices {starts}"
    # Keyed by where it sits: two shares at one placement cannot both get an instance there.
    key = f"{gpu.uuid}@{share.mig_placement}"
    if key in seen_mig:
        return f"{what} is listed twice"
    seen_mig.add(key)
    return ""


def mig_holders(gpu: GPUInfo, others: GPUHeld | None, *, placement: int = -1, uuid: str = "") -> frozenset[str]:
    """The other admitted pods that hold the MIG instance at `placement` or named `uuid` on `gpu`, by
    placement or by UUID (the node's picture links an instance's placement to its UUID)."""
    if others is None:
        return frozenset()
    uuids = {uuid} - {""}
    places = {placement} if placement >= 0 else set()
    uuids |= {m.uuid for m in gpu.mig_instances if m.uuid and m.placement_start in places}
    places |= {m.placement_start for m in gpu.mig_instances if m.uuid in uuids and m.placement_start >= 0}
    by_uuid, by_place = others.mig or {}, others.mig_placements or {}
    return frozenset().union(*(by_uuid.get(u, ()) for u in uuids), *(by_place.get(p, ()) for p in places))


def mig_profile(gpu: GPUInfo, name: str) -> MIGProfile | None:
    return next((p for p in gpu.mig_profiles if p.name == name), None)


def pods_text(pods: frozenset[str], *, shown: int = 3) -> str:
    listed = sorted(pods)
    more = f" and {len(listed) - shown} more" if len(listed) > shown else ""
    return f"{len(listed)} pod(s) already admitted on this node ({', '.join(listed[:shown])}{more})"
