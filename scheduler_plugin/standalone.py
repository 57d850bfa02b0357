"""Standalone mode: bind pending pods whose schedulerName is fgpu-scheduler ourselves.

The pod informer of the kubernetes backend hands every pending pod addressed
to us to `PendingQueue.add` (and `discard` once it is bound or gone), leader
or not, so a standby that takes over has its queue ready. Only the leader
pops pods. A pod that does not fit waits with exponential backoff; any
pod leaving the cluster (capacity freed) makes every waiting pod due again.

Standalone mode has no kube-scheduler in front of it: the node rules it does
check (taints, cordon, conditions, max pods, host ports) are part of the core's
filter, and a pod needing what it cannot check (pod affinity, a DoNotSchedule
topology spread, a PersistentVolumeClaim: `core/standalone_limits.py`) is
refused with a FailedScheduling Event instead of being placed without it.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_plugin import pods
from scheduler_plugin.core import standalone_limits
from scheduler_plugin.core.api import Clock
from scheduler_plugin.errors import Conflict, NotFound, ServiceError
from scheduler_plugin.events import EventRecorder
from scheduler_plugin.metrics import Result
from scheduler_plugin.scheduling import SchedulingService

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    pod: Mapping[str, Any]
    due: float
    backoff: float
    generation: int = 0


@dataclass(order=True)
class _Due:
    at: float
    generation: int
    uid: str = field(compare=False)


class PendingQueue:
    """Pods waiting for a node, keyed by uid, each due at a time (backoff)."""

    def __init__(self, *, clock: Clock = time.monotonic, initial_backoff_s: float = 1.0, max_backoff_s: float = 30.0) -> None:
        self._clock = clock
        self._initial = initial_backoff_s
        self._max = max_backoff_s
        self._entries: dict[str, _Entry] = {}
        self._heap: list[_Due] = []
        self._generation = 0
        self._cond = threading.Condition()

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)

    def add(self, pod: Mapping[str, Any]) -> None:
        uid = pods.uid(pod)
        with self._cond:
            entry = self._entries.get(uid)
            if entry is not None:
                entry.pod = pod  # newest copy; keep its place and backoff
                return
            self._push(uid, _Entry(pod=pod, due=self._clock(), backoff=self._initial))

    def discard(self, uid: str) -> None:
        with self._cond:
            self._entries.pop(uid, None)

    def retry_later(self, uid: str) -> None:
        with self._cond:
            entry = self._entries.get(uid)
            if entry is None:
                return
            entry.due = self._clock() + entry.backoff
            entry.backoff = min(entry.backoff * 2, self._max)
            self._push(uid, entry)

    def all_due_now(self) -> None:
        """Capacity was freed: every waiting pod is worth another try."""
        with self._cond:
            now = self._clock()
            for uid, entry in self._entries.items():
                entry.due = now
                entry.backoff = self._initial
                self._push(uid, entry)

    def pop(self, *, timeout_s: float) -> Mapping[str, Any] | None:
        """The next due pod (removed from the heap, kept as an entry until discarded), or None after timeout."""
        deadline = self._clock() + timeout_s
        with self._cond:
            while True:
                while self._heap:
                    head = self._heap[0]
                    entry = self._entries.get(head.uid)
                    if entry is None or entry.generation != head.generation:
                        heapq.heappop(self._heap)  # stale
                        continue
                    now = self._clock()
                    if head.at <= now:
                        heapq.heappop(self._heap)
                        entry.due = float("inf")
                        return entry.pod
                    break
                now = self._clock()
                if now >= deadline:
                    return None
                wait = deadline - now
                if self._heap:
                    wait = min(wait, max(0.0, self._heap[0].at - now))
                self._cond.wait(wait)

    def _push(self, uid: str, entry: _Entry) -> None:
        self._generation += 1
        entry.generation = self._generation
        self._entries[uid] = entry
        heapq.heappush(self._heap, _Due(at=entry.due, generation=entry.generation, uid=uid))
        self._cond.notify_all()


class StandaloneLoop:
    def __init__(
        self,
        *,
        service: SchedulingService,
        queue: PendingQueue,
        is_leader: Callable[[], bool],
        idle_wait_s: float = 0.2,
        recorder: EventRecorder | None = None,
    ) -> None:
        self._service = service
        #: posts the FailedScheduling Event of a pod refused before the service sees it
        self._recorder = recorder
        self._queue = queue
        self._is_leader = is_leader
        self._idle_wait_s = idle_wait_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fgpu-standalone", daemon=True)
        self._thread.start()

    def stop(self, grace: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(grace)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._is_leader():
                self._stop.wait(self._idle_wait_s)
                continue
            pod = self._queue.pop(timeout_s=self._idle_wait_s)
            if pod is None or self._stop.is_set():
                continue
            self.schedule_one(pod)

    def schedule_one(self, pod: Mapping[str, Any]) -> None:
        uid = pods.uid(pod)
        needs = standalone_limits.unsupported(pod)
        if needs:
            # Immutable on the pod: no retry can help. A later change re-queues it through the watch.
            self._refuse(pod, standalone_limits.refusal_message(needs))
            self._queue.discard(uid)
            return
        try:
            signed = self._service.schedule(pod)
        except (Conflict, NotFound) as exc:
            log.info("standalone: %s dropped: %s", pods.key(pod), exc)
            self._queue.discard(uid)
            return
        except ServiceError as exc:
            log.warning("standalone: %s not bound, will retry: %s", pods.key(pod), exc)
            self._queue.retry_later(uid)
            return
        except Exception:
            log.exception("standalone: scheduling %s failed unexpectedly; will retry", pods.key(pod))
            self._queue.retry_later(uid)
            return
        if signed is None:
            self._queue.retry_later(uid)
        else:
            self._queue.discard(uid)
            log.info("standalone: bound %s to %s", pods.key(pod), signed.node)

    def _refuse(self, pod: Mapping[str, Any], message: str) -> None:
        log.info("standalone: %s not scheduled: %s", pods.key(pod), message)
        metrics = self._service.metrics
        metrics.decisions.labels(result=Result.UNSCHEDULABLE.value).inc()
        # One fixed reason: the message names volumes and keys, which would make a label per pod.
        metrics.record_reasons(["pod needs what standalone mode does not check"])
        if self._recorder is None:
            return
        try:
            self._recorder.failed(pod, message)
        except Exception as exc:  # an Event is a courtesy; the pod stays unplaced either way
            log.warning("could not post event for %s: %s", pods.key(pod), exc)
