"""Which pending pods the descheduler makes room for: only those short of GPU, CPU or memory (pure, table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from apis import names
from scheduler_plugin.descheduler import safety, unschedulable
from tests.scheduler_service.builders import whole_pod

_PREEMPTION = " preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."


@pytest.mark.parametrize(
    ("message", "acts"),
    [
        # kube-scheduler's own words (NodeResourcesFit), with fgpu's resource names
        ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu." + _PREEMPTION, True),
        ("0/3 nodes are available: 1 Insufficient cpu, 2 Insufficient koordinator.sh/gpu-core.", True),
        ("0/3 nodes are available: 1 node(s) had untolerated taint {gpu: x}, 2 Insufficient memory.", True),
        # fgpu's filter (core/reasons.py) through the extender
        ("0/3 nodes are available: 3 node(s): 0 of 1 GPUs fully free, pod needs 1 whole GPU.", True),
        ("0/2 nodes are available: 2 node(s): no GPU has 50% core and 40Gi memory free for 1 GPU share of 50% core", True),
        ("0/1 nodes are available: 1 node(s): insufficient cpu: 500m free, pod needs 2000m.", True),
        # what moving pods cannot fix, even next to a shortage
        ('0/3 nodes are available: persistentvolumeclaim "data" not found.' + _PREEMPTION, False),
        ("0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match pod anti-affinity rules.", False),
        ("0/3 nodes are available: 3 node(s) didn't match pod topology spread constraints.", False),
        ("0/3 nodes are available: 3 node(s) had volume node affinity conflict.", False),
        ("0/3 nodes are available: 3 Insufficient example.com/fpga.", False),
        ("0/3 nodes are available: 3 Insufficient ephemeral-storage.", False),
        ("0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.", False),
        ("", False),
        # a shortage named only by preemption's summary is not the filters' reason
        ("0/3 nodes are available: 3 node(s) were unschedulable. preemption: 3 Insufficient cpu.", False),
    ],
)
def test_only_a_shortage_the_simulation_models_lets_the_descheduler_act(message: str, acts: bool) -> None:
    assert (unschedulable.why_not_for_room(message) == "") is acts, unschedulable.why_not_for_room(message)


def _pending(**spec: Any) -> dict[str, Any]:
    pod = whole_pod("train", namespace="t", scheduler_name=names.SCHEDULER_NAME)
    pod["spec"].update(spec)
    return pod


def _unschedulable(pod: dict[str, Any], message: str, *, reason: str = "Unschedulable") -> dict[str, Any]:
    pod["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}]}
    return pod


@pytest.mark.parametrize(
    ("pod", "acts"),
    [
        (_pending(), True),  # never tried by kube-scheduler (standalone fgpu writes no condition)
        (_unschedulable(_pending(), "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."), True),
        (_unschedulable(_pending(), "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", reason="SchedulerError"), False),
        (_pending(volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]), False),
        (_pending(affinity={"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}}]}}), False),
        (_pending(topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone"}]), False),
        (_pending(topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]), True),
        (_pending(containers=[{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1", "rdma/hca": "1"}}}]), False),
    ],
    ids=["no-condition", "short-of-gpu", "scheduler-error", "pvc", "anti-affinity", "spread", "spread-anyway", "other-resource"],
)
def test_a_pending_pod_is_acted_for_only_when_nothing_outside_the_model_holds_it(pod: dict[str, Any], acts: bool) -> None:
    assert (unschedulable.why_not_actionable(pod) == "") is acts, unschedulable.why_not_actionable(pod)


def test_a_victim_with_a_local_volume_claim_never_moves() -> None:
    pod = _pending(nodeName="n1", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "local-d"}}])
    pod["metadata"]["labels"] = {names.DEFRAG_OPT_IN_LABEL: names.DEFRAG_OPT_IN_VALUE}
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "s", "uid": "u", "controller": True}]
    pod["status"] = {"phase": "Running"}
    assert "local-d" in safety.why_not_movable(pod, None)
    del pod["spec"]["volumes"]
    assert safety.why_not_movable(pod, None) == ""
