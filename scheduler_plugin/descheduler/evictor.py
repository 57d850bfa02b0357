"""The one place that acts: evicts a plan's pods within the limits, or records what it would do.

Limits (descheduler style): moves per hour in the whole cluster and per node (a sliding hour),
and a plan is acted on whole or not at all. Dry-run counts the moves it would make against the
same limits, so it reports what the real mode would do. The last hour's moves are rebuilt at
start from the Events the evictor wrote (`DefragEvicted`, or `DefragWouldEvict` in dry-run): a
restart grants no fresh budget.

Every eviction goes through the Eviction API with the pod's uid as a precondition (a pod
recreated under the same name, as a StatefulSet's is, is never evicted in its place), so
PodDisruptionBudgets are the API server's to enforce. A budget's refusal (429 "would violate the
pod's disruption budget"), API throttling (any other 429: tried again next cycle), a pod gone or
replaced (404, 409 on the uid) stop the plan. Any other unexpected answer, including a failed
Event after an eviction (the move would be on no record a restart reads), stops the evictor
(`stopped`); the stop is recorded through `Cluster.save_stop` and read back at start, so it
holds across restarts until an operator clears it.
"""

from __future__ import annotations

import datetime
import logging
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
#: kube-apiserver's message on a 429 from a PodDisruptionBudget (pkg/registry/core/pod/storage/eviction.go);
#: any other 429 is API Priority and Fairness throttling.
BUDGET_REFUSAL = "would violate the pod's disruption budget"

log = logging.getLogger(__name__)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Cluster(Protocol):
    def evict_pod(self, *, namespace: str, name: str, uid: str) -> None: ...

    def record_event(self, *, namespace: str, name: str, uid: str, reason: str, message: str, node: str) -> None: ...

    def recent_moves(self, *, reason: str, since: datetime.datetime) -> Sequence[tuple[datetime.datetime, str]]:
        """(when, node moved from) of the Events of `reason` this descheduler wrote since `since`."""
        ...

    def saved_stop(self) -> str:
        """The reason a stop was recorded with, "" when none is."""
        ...

    def save_stop(self, reason: str) -> None: ...


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
    #: wall clock, to place the recorded Events on `clock`'s axis
    wall: Callable[[], datetime.datetime] = _utcnow
    stopped: str = ""
    _recent: deque[tuple[float, NodeName]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.stopped = self.stopped or self.cluster.saved_stop()
        now, wall = self.clock(), self.wall()
        since = wall - datetime.timedelta(seconds=HOUR_S)
        past = sorted(
            (now - (wall - when).total_seconds(), NodeName(node))
            for when, node in self.cluster.recent_moves(reason=self._reason, since=since)
        )
        self._recent.extend(past)

    @property
    def _reason(self) -> str:
        return names.EVENT_DEFRAG_WOULD_EVICT if self.limits.dry_run else names.EVENT_DEFRAG_EVICTED

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
        """No more evictions until an operator clears the recorded stop and restarts the process."""
        if self.stopped:
            return
        self.stopped = reason
        try:
            self.cluster.save_stop(reason)
        except KubeAPIError as exc:  # stopped in memory all the same; a restart would not know
            log.error("could not record the stop (%s); a restart would resume evicting: %s", reason, exc)

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
            uid = uids.get(move.key) or str(move.uid)
            if self.limits.dry_run:
                try:
                    self.cluster.record_event(
                        namespace=namespace, name=name, uid=uid, reason=names.EVENT_DEFRAG_WOULD_EVICT,
                        message=f"dry-run: would evict from {move.from_node} to {purpose}", node=str(move.from_node),
                    )
                except KubeAPIError as exc:  # nothing was disrupted: the plan is simply not recorded
                    log.warning("dry-run Event for %s failed: %s", move.key, exc)
                    return Outcome(tuple(done), "event-failed")
                self._recent.append((self.clock(), move.from_node))
                done.append(move.key)
                continue
            aborted = self._evict(namespace, name, uid, move.key)
            if aborted:
                return Outcome(tuple(done), aborted)
            self._recent.append((self.clock(), move.from_node))
            done.append(move.key)
            try:
                self.cluster.record_event(
                    namespace=namespace, name=name, uid=uid, reason=names.EVENT_DEFRAG_EVICTED,
                    message=f"evicted from {move.from_node} to {purpose}", node=str(move.from_node),
                )
            except KubeAPIError as exc:
                self.stop(f"{move.key} was evicted but its {names.EVENT_DEFRAG_EVICTED} Event failed ({exc}): "
                          "the move is on no record a restart would count")
                return Outcome(tuple(done), "unexpected-answer")
        return Outcome(tuple(done))

    def _evict(self, namespace: str, name: str, uid: str, key: str) -> str:
        """"" once evicted, else the abort reason."""
        try:
            self.cluster.evict_pod(namespace=namespace, name=name, uid=uid)
        except KubeAPIError as exc:
            if exc.status == 429:
                return "disruption-budget" if BUDGET_REFUSAL in str(exc) else "api-throttled"
            if exc.status == 404:
                return "pod-gone"
            if exc.status == 409 and "Precondition failed: UID" in str(exc):
                return "pod-gone"  # a pod of the same name, not the one planned for
            self.stop(f"eviction of {key} answered {exc.status}: {exc}")
            return "unexpected-answer"
        return ""
