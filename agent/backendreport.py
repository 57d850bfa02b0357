"""Keeps the verdict of `agent.backendcheck` current and tells the cluster: condition, Event, metric, log.

`IsolationMonitor.current()` is what the hook asks before it hands out a share; `report()` runs in
a `ReportLoop` and writes, only when they differ, the Node condition

    {"type": "FgpuIsolationReady", "status": "False", "reason": "LibraryMissing",
     "message": "isolation hami-core: HAMi-core's library /usr/local/vgpu/libvgpu.so cannot be read ..."}

(a strategic merge patch of nodes/status, merged by type: kubelet's conditions are left alone), and
posts an Event on the Node when the verdict changes (Warning IsolationNotReady, Normal IsolationReady).
`fgpuctl inspect` and `kubectl describe node` show the condition.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agent.backendcheck import CONDITION_TYPE, HostFiles, check
from agent.isolation.readiness import BackendStatus, Files, Machine
from agent.isolation.registry import IsolationPaths
from agent.kube import Kube
from agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

#: A verdict of "not ready" is looked at again after this long when the hook asks, so a node that
#: got its library admits shares at kubelet's next retry rather than at the next report pass.
RECHECK_NOT_READY_S = 5.0
#: Node events go to this namespace, as kubelet's do.
EVENT_NAMESPACE = "default"


class IsolationMonitor:
    def __init__(
        self,
        *,
        node_name: str,
        isolation: str,
        paths: IsolationPaths,
        metrics: AgentMetrics,
        kube: Kube | None = None,
        files: Files | None = None,
        machine: Machine | None = None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._node = node_name
        self._isolation = isolation
        self._paths = paths
        self._metrics = metrics
        self._kube = kube
        self._files = files or HostFiles()
        self._machine = machine or Machine.this()
        self._clock = clock
        self._now = now
        self._lock = threading.Lock()
        self._status: BackendStatus | None = None
        self._checked_at = 0.0
        #: The verdict the last Event told the cluster about (None: no Event yet).
        self._announced: BackendStatus | None = None

    def current(self) -> BackendStatus:
        with self._lock:
            status = self._status
            stale = status is None or (not status.ready and self._clock() - self._checked_at >= RECHECK_NOT_READY_S)
        return self.refresh() if stale or status is None else status

    def refresh(self) -> BackendStatus:
        """Checks the backend now; logs and counts a change."""
        status = check(self._isolation, self._paths, files=self._files, machine=self._machine)
        with self._lock:
            before, self._status, self._checked_at = self._status, status, self._clock()
        if before is None or (before.ready, before.reason, before.message) != (status.ready, status.reason, status.message):
            self._metrics.observe_isolation(status.isolation, ready=status.ready, reason=status.reason)
            (log.info if status.ready else log.warning)("isolation backend: %s", status.message)
        return status

    def report(self) -> None:
        """One pass: check, then bring the Node's condition (and an Event on change) in line."""
        status = self.refresh()
        if self._kube is None:
            return
        node = self._kube.get_node(self._node)
        if node is None:
            return  # the Kubernetes reporter warns about a missing Node
        patch = condition_patch(node, status, now=self._now())
        if patch is not None:
            self._kube.patch_node_conditions(self._node, [patch])
        announced = self._announced
        if announced is None and status.ready:
            self._announced = status  # a healthy start needs no Event
        elif announced is None or (announced.ready, announced.reason) != (status.ready, status.reason):
            self._kube.create_event(EVENT_NAMESPACE, event_body(node, status, now=self._now()))
            self._announced = status


def condition_patch(node: dict[str, Any], status: BackendStatus, *, now: datetime.datetime) -> dict[str, Any] | None:
    """The condition to write on `node`, or None when it says this already."""
    want = "True" if status.ready else "False"
    conditions = ((node.get("status") or {}).get("conditions")) or []
    have = next((c for c in conditions if isinstance(c, dict) and c.get("type") == CONDITION_TYPE), None)
    if have is not None and (have.get("status"), have.get("reason"), have.get("message")) == (want, status.reason, status.message):
        return None
    stamp = _timestamp(now)
    transition = have.get("lastTransitionTime") if have is not None and have.get("status") == want else stamp
    return {
        "type": CONDITION_TYPE,
        "status": want,
        "reason": status.reason,
        "message": status.message,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": transition or stamp,
    }


def event_body(node: dict[str, Any], status: BackendStatus, *, now: datetime.datetime) -> dict[str, Any]:
    metadata = node.get("metadata") or {}
    name = str(metadata.get("name", ""))
    stamp = _timestamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.fgpu-isolation.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": metadata.get("uid", "")},
        "type": "Normal" if status.ready else "Warning",
        "reason": "IsolationReady" if status.ready else "IsolationNotReady",
        "message": status.message
        + ("" if status.ready else "; GPU shares are rejected on this node, whole GPUs and MIG instances still work"),
        "source": {"component": "fgpu-agent", "host": name},
        "reportingComponent": "fgpu-agent",
        "reportingInstance": name,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def _timestamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
