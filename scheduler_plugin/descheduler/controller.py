"""One descheduler cycle: read the cluster, ask the triggers, ask the planner, hand the plan to the evictor.

Per cycle (`Controller.cycle`): the cluster is loaded into the scheduler's own core and policy
(`cluster_view.load`); the make-room trigger (`triggers.make_room_for`) names the pending GPU
pods worth moving others for, oldest first, and for each the planner (`plan_room`) is asked until
one plan comes back, which the `Evictor` carries out (or records, in dry-run). When no room was
made and the explicit consolidation mode is due, `triggers.nodes_to_empty` names low-occupancy
nodes and the same planner (`plan_consolidation`) is asked to empty one.

Pending pods the simulation cannot stand for (`cluster_view.ClusterView.set_aside`: waiting for a
volume, pod affinity, a topology spread, another resource) are never made room for, and only
candidates of at most the pending pod's priority are moved for it.

After acting for a pending pod it watches that pod (by uid) while the plan settles: only its
binding counts as success. Until then no other plan is made for it: its room is on its way (the
evicted pods shut down within their grace period, then their owners recreate them), and the
pending pod stays pending until they are gone, so another plan would move more pods for the same
pod. If it is still pending `settle_s` later, or gone without having bound (deleted, or replaced
by a pod of the same name), the plan did not work out as simulated, and the evictor is stopped (an
unexpected outcome is never retried blindly; a tenant who deletes and recreates the pending pod
cannot spend the budget again and again).

The settling plans live in this process only. A restart keeps the part the cluster shows: the
evicted pods still terminating are room on its way (`ClusterView.room_coming`), so no plan is made
for a pending pod that fits once they are gone. It loses the rest: after a restart, a pending pod
whose evicted pods are already gone but who is still pending (the recreated pods took its room) may
get another plan, and the bind-or-stop check of the plans made before the restart is not made.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.defrag_planner import NoPlan, Plan, plan_consolidation, plan_room
from scheduler_plugin.descheduler import cluster_view, triggers
from scheduler_plugin.descheduler.cluster_view import ClusterView, Reader
from scheduler_plugin.descheduler.evictor import Evictor
from scheduler_plugin.descheduler.triggers import ConsolidationSettings, RoomSettings


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Settings:
    policy: str = "fgpu"
    room: RoomSettings = field(default_factory=RoomSettings)
    consolidation: ConsolidationSettings = field(default_factory=ConsolidationSettings)
    max_moves_per_plan: int = 4
    #: how long the pod room was made for may stay pending before the evictor stops
    settle_s: float = 600.0


@dataclass
class Stats:
    """What one cycle did; main.py adds it to the Prometheus counters."""

    moves: int = 0
    #: pending pods room was made for
    made_room: int = 0
    #: GPUs x seconds those pods had waited when room was made for them (docs/defrag.md, Metrics)
    waited_gpu_seconds: float = 0.0
    consolidated_nodes: int = 0
    aborted: dict[str, int] = field(default_factory=dict)

    def abort(self, reason: str) -> None:
        self.aborted[reason] = self.aborted.get(reason, 0) + 1


@dataclass(frozen=True)
class Settling:
    """A plan carried out for pending pod `key` (uid `uid`) at `since` (the monotonic clock)."""

    key: str
    uid: str
    since: float


class Controller:
    def __init__(
        self,
        reader: Reader,
        evictor: Evictor,
        settings: Settings,
        *,
        now: Callable[[], datetime.datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self.evictor = evictor
        self.settings = settings
        self._now = now
        self._monotonic = monotonic
        self._last_consolidation: float | None = None
        #: pending pod uid -> the plan made for it, until it binds or the evictor stops
        self.settling: dict[str, Settling] = {}

    def cycle(self, stats: Stats) -> str:
        """One pass; returns what it did in a line (for logs and tests)."""
        view = cluster_view.load(self.reader, policy=self.settings.policy, now=self._now())
        self._check_last_plan(view, stats)
        if self.evictor.stopped:
            return f"stopped: {self.evictor.stopped}"
        line, acted = self._make_room(view, stats)
        if acted:
            return line
        now = self._monotonic()
        if triggers.consolidation_due(now_s=now, last_s=self._last_consolidation, settings=self.settings.consolidation):
            self._last_consolidation = now
            line = f"{line}; {self._consolidate(view, stats)}"
        return line

    def _check_last_plan(self, view: ClusterView, stats: Stats) -> None:
        for uid, plan in list(self.settling.items()):
            if uid in view.bound_uids:
                del self.settling[uid]
            elif uid not in view.pending_uids:
                stats.abort("pending-pod-gone")
                self.evictor.stop(f"pod {plan.key} (uid {uid}) is gone without having bound after room was made for it")
                del self.settling[uid]
            elif self._monotonic() - plan.since >= self.settings.settle_s:
                stats.abort("pending-pod-did-not-bind")
                self.evictor.stop(f"pod {plan.key} is still pending {self.settings.settle_s:g}s after room was made for it")
                del self.settling[uid]

    def _make_room(self, view: ClusterView, stats: Stats) -> tuple[str, bool]:
        for _ in view.set_aside:
            stats.abort("pending-pod-not-modelled")
        for _ in view.room_coming:
            stats.abort("room-on-its-way")
        waiting = dict(view.room_coming)
        for key, (request, _, _) in view.pending.items():
            if str(request.uid) in self.settling:
                stats.abort("plan-settling")
                waiting[key] = "the plan made for it is settling"
        decision = triggers.make_room_for(
            [pending for key, (_, pending, _) in view.pending.items() if key not in waiting],
            fragmented_of_idle=view.fragmentation.of_idle,
            idle_milli_by_model=view.idle_by_model,
            settings=self.settings.room,
        )
        if not decision.targets:
            notes = [f"{key} set aside: {why}" for key, why in sorted(view.set_aside.items())[:3]]
            notes += [f"{key} waits: {why}" for key, why in sorted(waiting.items())[:3]]
            return "; ".join([decision.reason, *notes]), False
        for key in decision.targets:
            left = self.evictor.moves_left()
            if left <= 0:
                stats.abort("rate-limit")
                return "rate limit reached", False
            request, pending, priority = view.pending[key]
            outcome = plan_room(
                view.core, request, view.candidates,
                max_moves=min(left, self.settings.max_moves_per_plan),
                allowances=view.allowances, node_moves_left=self._node_moves_left(view),
                max_priority=priority,
            )
            if isinstance(outcome, NoPlan):
                stats.abort(outcome.reason.value)
                continue
            if not self._act(outcome, view, stats, purpose=f"make room for pending pod {key}"):
                return f"plan for {key} stopped: {self.evictor.stopped or 'see aborted'}", True
            if not self.evictor.limits.dry_run:
                stats.made_room += 1
                stats.waited_gpu_seconds += (request.device.gpus if request.device else 0) * pending.age_s
                self.settling[str(request.uid)] = Settling(key, str(request.uid), self._monotonic())
            return f"made room for {key} on {outcome.target}: moved {', '.join(m.key for m in outcome.moves)}", True
        return "no plan", False

    def _consolidate(self, view: ClusterView, stats: Stats) -> str:
        max_moves = min(self.evictor.moves_left(), self.settings.max_moves_per_plan)
        decision = triggers.nodes_to_empty(view.loads, max_moves=max_moves, settings=self.settings.consolidation)
        if not decision.targets:
            return decision.reason
        node_left = self._node_moves_left(view)
        for name in decision.targets:
            node = NodeName(name)
            outcome = plan_consolidation(view.core, node, view.candidates, max_moves=max_moves, allowances=view.allowances)
            if isinstance(outcome, NoPlan):
                stats.abort(outcome.reason.value)
                continue
            if len(outcome.moves) > node_left.get(node, 0):
                stats.abort("rate-limit")
                continue
            if not self._act(outcome, view, stats, purpose=f"empty node {name} for whole-GPU pods"):
                return f"consolidation of {name} stopped"
            if not self.evictor.limits.dry_run:
                stats.consolidated_nodes += 1
            return f"emptied {name}: moved {', '.join(m.key for m in outcome.moves)}"
        return "no node could be emptied"

    def _act(self, plan: Plan, view: ClusterView, stats: Stats, *, purpose: str) -> bool:
        result = self.evictor.act(plan.moves, uids=view.uids, purpose=purpose)
        if not self.evictor.limits.dry_run:
            stats.moves += len(result.evicted)
        if result.aborted:
            stats.abort(result.aborted)
            return False
        return True

    def _node_moves_left(self, view: ClusterView) -> dict[NodeName, int]:
        return {c.node: self.evictor.node_moves_left(c.node) for c in view.candidates.values()}


def run_cycle(
    reader: Reader,
    evictor: Evictor,
    settings: Settings,
    stats: Stats,
    *,
    now: Callable[[], datetime.datetime] = _utcnow,
) -> str:
    """One pass of a fresh `Controller` (no memory of earlier cycles)."""
    return Controller(reader, evictor, settings, now=now).cycle(stats)
