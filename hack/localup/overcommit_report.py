"""What the overcommit demo prints: one row per pod, then what the GPU and the agent did.

Pure functions over plain values (hack/localup/overcommit_demo.py fills them in).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from hack.localup.report import human_bytes, memory_limit


@dataclass(frozen=True)
class DemoPod:
    """One demo pod: what it asked, what the scheduler signed, what its container saw, how it ended."""

    name: str
    tier: str  # guaranteed | burstable
    uid: str = ""
    request_core: int = 0
    request_bytes: int = 0
    limit_core: int = 0  # 0: no limit (guaranteed)
    limit_bytes: int = 0
    gpu: str = ""  # the GPU's UUID, "" while unplaced
    env: Mapping[str, str] = field(default_factory=dict)
    #: GPU memory its process used in the steady phase and under pressure
    used_steady_bytes: int = 0
    used_pressure_bytes: int = 0
    #: the API's last word: Running, Deleted, ...
    end: str = ""
    evicted_after_s: float | None = None


@dataclass(frozen=True)
class Outcome:
    ratio: str
    high_water: float
    gpu_uuid: str
    gpu_bytes: int
    pods: tuple[DemoPod, ...]
    steady_used_bytes: int = 0
    pressure_used_bytes: int = 0
    after_used_bytes: int = 0
    #: the Events `BurstableEvicted` on the demo's pods: (pod name, message)
    events: tuple[tuple[str, str], ...] = ()
    #: fgpu_agent_reclaim_evictions_total{result="evicted"} summed over GPUs
    metric_evicted: float = 0.0
    problems: tuple[str, ...] = ()

    def pod(self, name: str) -> DemoPod:
        return next(p for p in self.pods if p.name == name)

    @property
    def guaranteed_free_bytes(self) -> int:
        """What the guaranteed shares leave free on the GPU: the ratio's base."""
        return self.gpu_bytes - sum(p.request_bytes for p in self.pods if p.tier == "guaranteed" and p.gpu)


HEADERS = ("POD", "TIER", "REQUEST", "LIMIT", "MEMORY CAP IN ITS ENV", "GPU MEMORY USED", "END")


def _share(core: int, memory: int) -> str:
    return f"{core}% core, {human_bytes(memory)}" if memory else "-"


def row(p: DemoPod) -> tuple[str, ...]:
    end = p.end
    if p.evicted_after_s is not None:
        end = f"{end} ({p.evicted_after_s:.1f}s after the pressure began)"
    used = f"{human_bytes(p.used_steady_bytes)} -> {human_bytes(p.used_pressure_bytes)}" if p.used_steady_bytes else "-"
    return (p.name, p.tier, _share(p.request_core, p.request_bytes), _share(p.limit_core, p.limit_bytes),
            memory_limit(p.env) if p.env else "-", used, end)


def table(pods: Sequence[DemoPod]) -> str:
    rows = [HEADERS, *(row(p) for p in pods)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def summary(o: Outcome) -> str:
    free = o.guaranteed_free_bytes
    lines = [
        f"GPU {o.gpu_uuid[:12]} ({human_bytes(o.gpu_bytes)}): the guaranteed shares leave {human_bytes(free)} free;"
        f" ratio {o.ratio} lets burstable limits reach {human_bytes(int(float(o.ratio) * free))}.",
    ]
    for p in o.pods:
        if p.tier == "burstable" and p.gpu and p.limit_bytes > free:
            lines.append(f"{p.name}: limit {human_bytes(p.limit_bytes)} > {human_bytes(free)} free: admitted beyond the"
                         " guaranteed capacity (its request is what the scheduler reserves).")
    lines.append(
        f"GPU memory in use: steady {human_bytes(o.steady_used_bytes)} ({_percent(o.steady_used_bytes, o.gpu_bytes)}),"
        f" scripted growth {human_bytes(o.pressure_used_bytes)} ({_percent(o.pressure_used_bytes, o.gpu_bytes)},"
        f" highWater {o.high_water:.0%}), after reclaim {human_bytes(o.after_used_bytes)}."
    )
    lines += [f"Event BurstableEvicted on {name}: {message}" for name, message in o.events]
    lines.append(f'fgpu_agent_reclaim_evictions_total{{result="evicted"}} = {o.metric_evicted:g}')
    lines += [f"PROBLEM: {p}" for p in o.problems]
    return "\n".join(lines)


def to_json(o: Outcome) -> str:
    data = asdict(o)
    data["guaranteed_free_bytes"] = o.guaranteed_free_bytes
    data["pods"] = {p.name: {**asdict(p), "env": dict(p.env)} for p in o.pods}
    data["events"] = [{"pod": name, "message": message} for name, message in o.events]
    data["ok"] = not o.problems
    return json.dumps(data, indent=2, sort_keys=True)
