"""Comparable summaries of a service's state, for before/after assertions."""

from __future__ import annotations

from scheduler_plugin.scheduling import SchedulingService

#: node -> GPU uuid -> (allocated core %, allocated memory bytes, sorted (pod uid, core, memory, assumed))
State = dict[str, dict[str, tuple[int, int, tuple[tuple[str, int, int, bool], ...]]]]


def state_of(service: SchedulingService) -> State:
    out: State = {}
    for view in service.node_views():
        out[view.name] = {
            g.device.uuid: (
                g.allocated_core_percent,
                g.allocated_memory_bytes,
                tuple(sorted((p.uid, p.core_percent, p.memory_bytes, p.assumed) for p in g.pods)),
            )
            for g in view.gpus
        }
    return out


def over_capacity(service: SchedulingService) -> list[str]:
    """GPUs allocated beyond 100% core or their memory."""
    bad = []
    for view in service.node_views():
        for g in view.gpus:
            if g.allocated_core_percent > 100 or g.allocated_memory_bytes > g.device.memory_bytes:
                bad.append(f"{view.name}/{g.device.uuid}: {g.allocated_core_percent}% {g.allocated_memory_bytes}B")
    return bad
