"""What the cluster-level gauges show: GPU pods waiting for fgpu, and FGD's fragmentation per model.

The dashboard's "pending while fragmented" alert and panels read these; they answer "is my pod
Pending because the cluster is full, or because its free GPU capacity is in pieces?".

* Pending GPU pods are those addressed to fgpu-scheduler, not bound, not finished or being
  deleted, whose request names a GPU resource (an invalid one too: it waits just the same). Age
  is counted from the pod's creationTimestamp, so a scheduler restart does not reset it.
* Fragmentation is FGD's measure with the simulator's code (`core.fragmentation` through
  `policy_fgd.FragmentationTracker`), over the core's own state, against the shapes of the pods
  placed now (whole single GPUs while nothing is placed), summed per GPU model, in milli-GPU.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Mapping
from typing import Any

from apis.request import RequestError
from apis.translation import TranslationRules
from scheduler_plugin import pods
from scheduler_plugin.core.api import NodeView
from scheduler_plugin.core.fragmentation import MILLI, PodShape, TargetWorkload
from scheduler_plugin.core.policy_fgd import FragmentationTracker
from scheduler_plugin.core.scheduler import Scheduler

#: measured against this when no GPU pod is placed: the shape every GPU can take when free
_WHOLE_GPU = TargetWorkload.from_counts({PodShape(cpu_milli=0, gpu_milli=MILLI, num_gpu=1): 1})


class PendingGPUPods:
    """uid -> creation time (epoch seconds) of the GPU pods waiting for fgpu. Not thread-safe: the
    service calls it under its lock."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def observe(self, pod: Mapping[str, Any], *, rules: TranslationRules | None, now: float) -> None:
        uid = str(pods.uid(pod))
        if not pods.wants_us(pod) or not _asks_for_gpu(pod, rules):
            self._since.pop(uid, None)
            return
        if uid not in self._since:
            self._since[uid] = _created(pod, default=now)

    def forget(self, uid: str) -> None:
        self._since.pop(uid, None)

    def count(self) -> int:
        return len(self._since)

    def oldest_age_s(self, now: float) -> float:
        return max(0.0, now - min(self._since.values())) if self._since else 0.0


def _asks_for_gpu(pod: Mapping[str, Any], rules: TranslationRules | None) -> bool:
    try:
        return pods.request_of(pod, rules=rules).device is not None
    except RequestError:
        return True  # only a GPU request is refused by fgpu's reading; the pod waits all the same
    except (ValueError, TypeError):
        return False


def _created(pod: Mapping[str, Any], *, default: float) -> float:
    raw = pods.meta(pod).get("creationTimestamp")
    if isinstance(raw, datetime.datetime):
        return raw.timestamp()
    if isinstance(raw, str) and raw:
        try:
            return datetime.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return default
    return default


def placed_workload(views: list[NodeView]) -> TargetWorkload:
    """The shapes of the GPU pods placed now (per-GPU compute, GPU count), by how often each occurs."""
    cards: Counter[str] = Counter()
    milli: dict[str, int] = {}
    for view in views:
        for gpu in view.gpus:
            for pod in gpu.pods:
                if pod.core_percent > 0:
                    cards[pod.uid] += 1
                    milli[pod.uid] = pod.core_percent * MILLI // 100
    shapes: Counter[PodShape] = Counter(
        PodShape(cpu_milli=0, gpu_milli=milli[uid], num_gpu=n) for uid, n in cards.items()
    )
    return TargetWorkload.from_counts(shapes) if shapes else _WHOLE_GPU


def fragmentation_by_model(core: object, views: list[NodeView]) -> dict[str, float]:
    """FGD's fragmentation (milli-GPU) per GPU model over the core's nodes; {} for a core of another kind."""
    if not isinstance(core, Scheduler):
        return {}
    state = core.state
    tracker = FragmentationTracker(state, placed_workload(views))
    tracker.refresh()
    out: dict[str, float] = {}
    for _name, slot in state.slot_of.items():
        if not state.active[slot] or state.gpu_count[slot] <= 0:
            continue
        model_id = int(state.model_id[slot, 0])
        model = state.models[model_id] if model_id >= 0 else "unknown"
        out[model] = out.get(model, 0.0) + float(tracker.index.node_frag[slot])
    return out
