"""When the descheduler acts, and for what (pure, over plain data; tests/defrag/test_triggers.py).

Two triggers, both answered by the same planner (`core/defrag_planner.py`):

* **Make room** (always on): GPU pods addressed to fgpu pending at least `pending_s`, while at
  least `min_fragmentation` of the idle GPU is fragmented (FGD's measure, `core/defrag_measure.py`,
  the ratio the `FgpuGPUPodsPendingWhileFragmented` alert uses). Of those pods, oldest first, only
  the ones the idle GPU of their models would hold were it in one piece (taken out of it in turn, as
  the churn replay's `fragmentation_blocked` does): moving pods cannot help a pod the cluster is
  simply too full for.
* **Consolidate** (an explicit mode, off unless `every_s` > 0): every `every_s`, nodes whose GPU
  occupancy is at most `max_occupancy` and whose GPU pods may all move, fewest pods first, are
  offered to the planner to be emptied for whole-GPU and multi-GPU pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    key: str
    age_s: float
    #: the GPU share it asks for, milli-GPU over all its cards
    gpu_milli: int
    #: GPU models it may use; empty = any
    models: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RoomSettings:
    pending_s: float = 300.0
    #: share (0..1) of the idle GPU that must be fragmented
    min_fragmentation: float = 0.25


@dataclass(frozen=True)
class Decision:
    #: pod keys (make room) or node names (consolidate), in the order to try them
    targets: tuple[str, ...]
    #: why nothing, when `targets` is empty
    reason: str = ""


def make_room_for(
    pending: Sequence[Pending],
    *,
    fragmented_of_idle: float,
    idle_milli_by_model: Mapping[str, int],
    settings: RoomSettings,
) -> Decision:
    waited = sorted((p for p in pending if p.gpu_milli > 0 and p.age_s >= settings.pending_s), key=lambda p: (-p.age_s, p.key))
    if not waited:
        return Decision((), f"no GPU pod pending {settings.pending_s:g}s or longer")
    if fragmented_of_idle < settings.min_fragmentation:
        return Decision(
            (),
            f"{fragmented_of_idle:.0%} of the idle GPU is fragmented, under the threshold {settings.min_fragmentation:.0%}",
        )
    pool = {model: milli for model, milli in idle_milli_by_model.items() if milli > 0}
    chosen: list[str] = []
    for pod in waited:
        models = [m for m in (sorted(pod.models) or sorted(pool)) if pool.get(m, 0) > 0]
        if sum(pool[m] for m in models) < pod.gpu_milli:
            continue
        need = pod.gpu_milli
        for model in sorted(models, key=lambda m: (-pool[m], m)):
            take = min(need, pool[model])
            pool[model] -= take
            need -= take
            if not need:
                break
        chosen.append(pod.key)
    if not chosen:
        return Decision((), "the idle GPU would not hold any pending GPU pod even in one piece: the cluster is full")
    return Decision(tuple(chosen))


@dataclass(frozen=True)
class NodeLoad:
    name: str
    gpus: int
    #: GPU share in use, milli-GPU
    allocated_milli: int
    gpu_pods: int
    #: of `gpu_pods`, how many the descheduler may move
    movable_gpu_pods: int


@dataclass(frozen=True)
class ConsolidationSettings:
    #: seconds between consolidations; 0 = the mode is off
    every_s: float = 0.0
    #: nodes at most this share (0..1) of whose GPU is in use are emptied
    max_occupancy: float = 0.25
    #: only nodes with at least this many GPUs
    min_gpus: int = 1


def consolidation_due(*, now_s: float, last_s: float | None, settings: ConsolidationSettings) -> bool:
    if settings.every_s <= 0:
        return False
    return last_s is None or now_s - last_s >= settings.every_s


def nodes_to_empty(loads: Sequence[NodeLoad], *, max_moves: int, settings: ConsolidationSettings) -> Decision:
    fitting = [
        n
        for n in loads
        if n.gpus >= settings.min_gpus
        and 0 < n.gpu_pods <= max_moves
        and n.movable_gpu_pods == n.gpu_pods
        and n.allocated_milli <= settings.max_occupancy * n.gpus * 1000
    ]
    if not fitting:
        return Decision(
            (),
            f"no node with {settings.min_gpus}+ GPUs at most {settings.max_occupancy:.0%} occupied whose "
            f"GPU pods (1..{max_moves}) may all move",
        )
    fitting.sort(key=lambda n: (n.gpu_pods, n.allocated_milli / n.gpus, n.name))
    return Decision(tuple(n.name for n in fitting))
