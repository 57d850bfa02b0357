"""Pod Events for scheduling failures and successes, with per-node reasons summarized.

The summary reads like kube-scheduler's own ("0/3 nodes are available: 2 node(s)
had ...; 1 node(s) ..."): identical reasons are counted, most frequent first,
so a person sees at a glance why the pod waits. The building of the message
and of the Event body is pure; `EventRecorder` adds the de-duplication and
hands the body to whatever posts it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from apis import names
from scheduler_plugin.core.api import Clock, NodeVerdict

FAILED_SCHEDULING = "FailedScheduling"
SCHEDULED = "Scheduled"
#: A bound pod's allocation annotation does not verify (boundpods.py says what is counted instead).
ALLOCATION_NOT_VERIFIED = "AllocationNotVerified"

#: Post an Event body into a namespace (kube.Kube.create_event, or a list in tests).
EventSink = Callable[[str, dict[str, Any]], None]

#: Most distinct reasons listed in one message; the rest are counted.
_MAX_REASONS = 5
#: The API server refuses an Event whose message is longer, counted in UTF-8 bytes when eventTime
#: is set (Kubernetes' NoteLengthLimit, compared with Go's len()).
MESSAGE_MAX_BYTES = 1024
#: Marks a message cut to fit.
_CUT_MARK = "\u2026"


def summarize(verdicts: Sequence[NodeVerdict], *, pod_error: str = "") -> str:
    """One line saying why no node fits."""
    if pod_error:
        return f"pod request is invalid: {pod_error}"
    total = len(verdicts)
    fit = sum(1 for v in verdicts if v.feasible)
    if total == 0:
        return "0/0 nodes are available: no node with GPUs is known to the scheduler."
    counts = Counter(v.reason or "no reason given" for v in verdicts if not v.feasible)
    parts = [f"{n} node(s): {reason}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    if len(parts) > _MAX_REASONS:
        rest = sum(n for _, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[_MAX_REASONS:])
        parts = [*parts[:_MAX_REASONS], f"{rest} node(s): other reasons"]
    return f"{fit}/{total} nodes are available: " + "; ".join(parts) + "."


def fit_message(message: str, max_bytes: int = MESSAGE_MAX_BYTES) -> str:
    """`message` cut to at most `max_bytes` UTF-8 bytes at a character boundary, the cut marked with an ellipsis."""
    data = message.encode()
    if len(data) <= max_bytes:
        return message
    room = max_bytes - len(_CUT_MARK.encode())
    # errors="ignore" drops a character the byte cut split in two
    return data[:room].decode(errors="ignore") + _CUT_MARK


def event_body(
    *,
    pod: Mapping[str, Any],
    reason: str,
    message: str,
    warning: bool,
    instance: str,
    now: datetime,
) -> dict[str, Any]:
    """A core/v1 Event about `pod` (a pod dict as the API returns it)."""
    meta = pod.get("metadata") or {}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    micro = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta.get('name', 'pod')}.{int(now.timestamp() * 1e9):x}",
            "namespace": meta.get("namespace", "default"),
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", "default"),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "reason": reason,
        "message": fit_message(message),
        "type": "Warning" if warning else "Normal",
        "source": {"component": names.SCHEDULER_NAME},
        "reportingComponent": names.SCHEDULER_NAME,
        "reportingInstance": instance,
        "action": "Scheduling" if warning else "Binding",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "eventTime": micro,
        "count": 1,
    }


@dataclass
class _Last:
    message: str
    at: float


class EventRecorder:
    """Posts Events, skipping a repeat of the same message for the same pod within `repeat_after_s`.

    A pod that stays unschedulable is retried often; without this its Event
    list would fill with copies of one line.
    """

    def __init__(
        self, *, sink: EventSink, clock: Clock, instance: str, repeat_after_s: float = 60.0, wall: Callable[[], datetime] | None = None
    ) -> None:
        self._sink = sink
        self._clock = clock
        self._instance = instance
        self._repeat_after_s = repeat_after_s
        self._wall = wall or (lambda: datetime.now(UTC))
        self._last: dict[str, _Last] = {}
        self._lock = threading.Lock()

    def failed(self, pod: Mapping[str, Any], message: str) -> bool:
        return self._record(pod, FAILED_SCHEDULING, message, warning=True)

    def scheduled(self, pod: Mapping[str, Any], message: str) -> bool:
        return self._record(pod, SCHEDULED, message, warning=False)

    def unverified_allocation(self, pod: Mapping[str, Any], message: str) -> bool:
        return self._record(pod, ALLOCATION_NOT_VERIFIED, message, warning=True)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._last.pop(uid, None)

    def _record(self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool) -> bool:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        now = self._clock()
        with self._lock:
            last = self._last.get(uid)
            if last is not None and last.message == message and now - last.at < self._repeat_after_s:
                return False
            self._last[uid] = _Last(message=message, at=now)
        body = event_body(pod=pod, reason=reason, message=message, warning=warning, instance=self._instance, now=self._wall())
        self._sink(str(body["metadata"]["namespace"]), body)
        return True
