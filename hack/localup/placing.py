"""Schedules one pod the way kube-scheduler drives fgpu: Filter, Score, Reserve, Bind over gRPC.

With the embedded state backend, Bind records the pod, with the signed
annotations the kubernetes backend would have written onto it, in the
scheduler's SQLite file. Bind's answer names the GPUs but carries no
signature (no RPC answer does: a caller could paste it onto any pod), so the
annotations are read from that record, as kubelet reads them from the API
server: `bound_pod` is the reader (hack/localup/stack.py `Stack.bound_pod`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from hack.localup.report import Share


@dataclass(frozen=True)
class Placement:
    node: str
    shares: tuple[Share, ...]
    #: the pod's annotations as the scheduler wrote them at bind (allocation, signature, node for a GPU pod)
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class Unschedulable:
    reason: str


#: uid -> the pod as the scheduler stored it at bind, or None
BoundPodReader = Callable[[str], Mapping[str, Any] | None]


class BindNotRecorded(RuntimeError):
    """Bind answered, yet the scheduler's record has no such pod: the two disagree."""


class SchedulerClient:
    def __init__(self, address: str, *, bound_pod: BoundPodReader, timeout_s: float = 10.0) -> None:
        self._bound_pod = bound_pod
        self._channel = grpc.insecure_channel(address)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)  # type: ignore[no-untyped-call]
        self._timeout_s = timeout_s

    def close(self) -> None:
        self._channel.close()

    def place(self, pod: Mapping[str, Any]) -> Placement | Unschedulable:
        message = pod_message(pod)
        t = self._timeout_s
        filtered = self._stub.Filter(scheduler_pb2.FilterRequest(pod=message), timeout=t)
        if filtered.pod_error:
            return Unschedulable(reason=filtered.pod_error)
        feasible = [v.node_name for v in filtered.verdicts if v.feasible]
        if not feasible:
            return Unschedulable(reason=summarize(filtered.verdicts))
        scored = self._stub.Score(scheduler_pb2.ScoreRequest(pod=message, node_names=feasible), timeout=t)
        node = best_node(scored.scores) or feasible[0]
        self._stub.Reserve(scheduler_pb2.ReserveRequest(pod=message, node_name=node), timeout=t)
        try:
            bound = self._stub.Bind(scheduler_pb2.BindRequest(pod=message, node_name=node), timeout=t)
        except grpc.RpcError:
            # A reservation nobody binds would hold the GPUs until it expires.
            self._stub.Unreserve(scheduler_pb2.UnreserveRequest(pod=message, node_name=node), timeout=t)
            raise
        allocation = bound.allocation
        return Placement(
            node=allocation.node_name or node,
            shares=tuple(
                Share(minor=g.minor, uuid=g.mig_uuid or g.uuid, core_percent=g.core_percent, memory_bytes=g.memory_bytes)
                for g in allocation.gpus
            ),
            annotations=self._written_annotations(message.uid),
        )

    def _written_annotations(self, uid: str) -> dict[str, str]:
        stored = self._bound_pod(uid)
        if stored is None:
            raise BindNotRecorded(f"pod uid {uid}: Bind succeeded but the scheduler's state has no such bound pod")
        annotations = (stored.get("metadata") or {}).get("annotations") or {}
        return {str(k): str(v) for k, v in annotations.items()}

    def release(self, pod: Mapping[str, Any], *, node: str) -> None:
        """Forgets a bound pod (Unreserve), as the scheduler would on seeing it deleted."""
        message = pod_message(pod)
        self._stub.Unreserve(scheduler_pb2.UnreserveRequest(pod=message, node_name=node), timeout=self._timeout_s)


def pod_message(pod: Mapping[str, Any]) -> scheduler_pb2.Pod:
    meta = pod.get("metadata") or {}
    return scheduler_pb2.Pod(
        namespace=str(meta.get("namespace", "default")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        manifest_json=json.dumps(pod),
    )


def best_node(scores: Any) -> str:
    """The highest score; ties go to the first name, so a run is repeatable."""
    ranked = sorted((-int(s.score), str(s.node_name)) for s in scores)
    return ranked[0][1] if ranked else ""


def summarize(verdicts: Any) -> str:
    reasons = [f"{v.node_name}: {v.reason}" if v.node_name else str(v.reason) for v in verdicts]
    return "; ".join(reasons) or "no node reported by any agent"
