"""A burstable share on the node: its signed limit onto the container's GPU, and where it is refused.

The scheduler signs a burstable share's limit into the allocation (`GPUShare.limit`,
`names.ALLOCATION_BURST_LIMIT`); the hook hands it to the backend here, never the pod's own
annotations, which the pod's author may change after scheduling. What each backend makes of it:

* hami-core: memory cap = the limit (shared by the container's processes), SM cap = the core
  limit (cached per process at start by the HAMi-core release read; docs/overcommit.md);
* mps: pinned memory = the limit, per client *process* (a pod of k CUDA processes may pin k x
  it), active thread percentage = the request;
* none: nothing limits anything, so a burstable share is refused (its burst could take a
  guaranteed neighbour's memory with no way back but an OOM in the neighbour).

docs/overcommit.md says where a burst can still hurt a guaranteed neighbour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from agent.isolation import registry
from agent.isolation.edits import VisibleGPU
from apis import names
from apis.allocation import ShareLimit


def with_limit(gpu: VisibleGPU, limit: ShareLimit | None, *, gpu_memory_bytes: int) -> VisibleGPU:
    """`gpu` carrying the share's burstable limit (unchanged for a guaranteed share)."""
    if limit is None or gpu.unlimited:
        return gpu
    limit_bytes = max(limit.memory_bytes or gpu_memory_bytes * limit.memory_ratio_percent // 100, gpu.memory_bytes)
    return replace(
        gpu,
        burst_core_percent=max(limit.core_percent, gpu.core_percent),
        burst_memory_bytes=min(limit_bytes, gpu_memory_bytes),
    )


def refusal(gpus: Sequence[VisibleGPU], *, isolation: str) -> str:
    """Why the backend `isolation` cannot take these GPUs' burstable shares; "" when it can."""
    if not any(g.burstable for g in gpus):
        return ""
    if registry.backend(isolation).enforces_limits:
        return ""
    return (
        f"the pod's GPU share is burstable ({names.GPU_QOS}: {names.GPU_QOS_BURSTABLE}), but this node's isolation "
        f"backend is {isolation!r}, which enforces no limit, so a burst could take a guaranteed neighbour's memory; "
        f"schedule it on a node pool whose backend is {names.ISOLATION_HAMI_CORE} or {names.ISOLATION_MPS} "
        f"(such nodes carry {names.NODE_BURSTABLE_RATIO})"
    )
