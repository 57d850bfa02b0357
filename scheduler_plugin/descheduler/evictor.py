"""The one place that acts: evicts a plan's pods within the limits, or records what it would do.

Limits (descheduler style): moves per hour in the whole cluster and per node (a sliding hour),
and a plan is acted on whole or not at all. Every eviction goes through the Eviction API, so
PodDisruptionBudgets are the API server's to enforce; a refusal (429) stops the plan, any other
unexpected answer stops the evictor until it is restarted (`stopped`). Dry-run evicts nothing and
records a `DefragWouldEvict` Event per pod instead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from apis import names
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.defrag_planner import Move
from scheduler_plugin.errors import KubeAPIError

HOUR_S = 3600.0


class Cluster(Protocol):
    def evict_pod(self, *, namespace: str, name: str) -> None: ...

    def record_event(self, *, namespace: str, name: str, uid: str, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class Limits:
    per_hour: int = 10
    per_node_per_hour: int = 2
    dry_run: bool = True


@dataclass(frozen=True)
class Outcome:
    evicted: tuple[str, ...]
    #: "" when the whole plan went through (or was recorded in dry-run)
    aborted: str = ""


@dataclass
class Evictor:
    cluster: Cluster
    limits: Limits
    clock: Callable[[], float] = time.monotonic
    stopped: str = ""
    _recent: deque[tuple[float, NodeName]] = field(default_factory=deque)

    def _prune(self) -> None:
        now = self.clock()
        while self._recent and now - self._recent[0][0] >= HOUR_S:
            self._recent.popleft()

    def moves_left(self) -> int:
        self._prune()
        return max(0, self.limits.per_hour - len(self._recent))

    def node_moves_left(self, node: NodeName) -> int:
        self._prune()
        return max(0, self.limits.per_node_per_hour - sum(1 for _, n in self._recent if n == node))

    def stop(self, reason: str) -> None:
        """No more evictions until the process restarts (an outcome the plan did not foresee)."""
        if not self.stopped:
            self.stopped = reason

    def act(self, moves: Sequence[Move], *, uids: Mapping[str, str], purpose: str) -> Outcome:
        """Evicts `moves` (pod keys namespace/name), each with an Event saying `purpose`
        ("make room for pending pod ns/name", "empty node n1 for whole-GPU pods")."""
        if self.stopped:
            return Outcome((), f"stopped: {self.stopped}")
        if len(moves) > self.moves_left() or any(
            self.node_moves_left(m.from_node) < sum(1 for o in moves if o.from_node == m.from_node) for m in moves
        ):
            return Outcome((), "rate-limit")
        done: list[str] = []
        for move in moves:
            namespace, _, name = move.key.partition("/")
            uid = uids.get(move.key, "")
            if self.limits.dry_run:
                self.cluster.record_event(
                    namespace=namespace, name=name, uid=uid, reason=names.EVENT_DEFRAG_WOULD_EVICT,
                    message=f"dry-run: would evict from {move.from_node} to {purpose}",
                )
                done.append(move.key)
                continue
            try:
                self.cluster.evict_pod(namespace=namespace, name=name)
            except KubeAPIError as exc:
                if exc.status == 429:
                    return Outcome(tuple(done), "disruption-budget")
                if exc.status == 404:
                    return Outcome(tuple(done), "pod-gone")
                self.stopped = f"eviction of {move.key} answered {exc.status}: {exc}"
                return Outcome(tuple(done), "unexpected-answer")
            self._recent.append((self.clock(), move.from_node))
            self.cluster.record_event(
                namespace=namespace, name=name, uid=uid, reason=names.EVENT_DEFRAG_EVICTED,
                message=f"evicted from {move.from_node} to {purpose}",
            )
            done.append(move.key)
        return Outcome(tuple(done))
