"""Standalone mode keeps kube-scheduler's rules: node rules from the Node objects hold, pods needing what
standalone cannot check get a FailedScheduling Event instead of a placement, gated pods wait."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from apis import names
from scheduler_plugin import pods
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.api import NodeInfo, NodeName
from scheduler_plugin.core.noderules import HostPort, Toleration, node_rules
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.events import EventRecorder
from scheduler_plugin.scheduling import SchedulingService
from scheduler_plugin.standalone import PendingQueue, StandaloneLoop
from tests.scheduler_service.builders import gpu_node, share_pod
from tests.scheduler_service.conftest import KEY


def _node_object(name: str, *, unschedulable: bool = False, ready: str = "True", taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"unschedulable": unschedulable, "taints": list(taints or [])},
        "status": {
            "conditions": [{"type": "Ready", "status": ready}],
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
        },
    }


def _feed_node(service: SchedulingService, obj: dict[str, Any]) -> None:
    """A node with two GPUs, fed the way the kubernetes backend's informers feed its Node and Device."""
    name = NodeName(obj["metadata"]["name"])
    service.report_devices(gpu_node(name, gpus=2))
    service.on_node(
        NodeInfo(name=name, labels=obj["metadata"]["labels"], cpu_milli=64000, memory_bytes=512 * 2**30, rules=node_rules(obj))
    )


@dataclass
class Standalone:
    service: SchedulingService
    loop: StandaloneLoop
    queue: PendingQueue
    events: list[dict[str, Any]]


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    """A standalone scheduler on the embedded store, its Events collected (the loop is driven by hand)."""
    events: list[dict[str, Any]] = []
    recorder = EventRecorder(
        sink=lambda _ns, body: events.append(body), clock=lambda: 0.0, instance="test", wall=lambda: datetime(2024, 5, 1, tzinfo=UTC)
    )
    backend = EmbeddedBackend(path=str(tmp_path / "state.db"))
    service = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=KEY, recorder=recorder)
    backend.start(service)
    queue = PendingQueue()
    loop = StandaloneLoop(service=service, queue=queue, is_leader=lambda: True, recorder=recorder)
    yield Standalone(service=service, loop=loop, queue=queue, events=events)
    backend.stop()


def _ours(name: str, **spec: Any) -> dict[str, Any]:
    pod = share_pod(name, core=50, memory="10Gi", scheduler_name=names.SCHEDULER_NAME)
    pod["spec"].update(spec)
    return pod


TAINTED = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]


def test_standalone_binds_only_to_the_node_that_is_ready_uncordoned_and_untainted(standalone: Standalone) -> None:
    service = standalone.service
    _feed_node(service, _node_object("cordoned", unschedulable=True))
    _feed_node(service, _node_object("not-ready", ready="False"))
    _feed_node(service, _node_object("unreachable", ready="Unknown"))
    _feed_node(service, _node_object("tainted", taints=TAINTED))
    _feed_node(service, _node_object("ok"))

    placed = [service.schedule(_ours(f"p{i}")) for i in range(5)]

    assert [p.node if p else None for p in placed] == ["ok", "ok", "ok", "ok", None]


def test_a_pod_no_node_rule_admits_gets_a_failed_scheduling_event_with_each_nodes_reason(standalone: Standalone) -> None:
    _feed_node(standalone.service, _node_object("cordoned", unschedulable=True))
    _feed_node(standalone.service, _node_object("tainted", taints=TAINTED))

    standalone.loop.schedule_one(_ours("p"))

    (event,) = standalone.events
    assert event["reason"] == "FailedScheduling"
    assert event["message"] == (
        "0/2 nodes are available: 1 node(s): node has taint dedicated=ml:NoSchedule the pod does not tolerate; "
        "1 node(s): node is cordoned (spec.unschedulable)."
    )


def test_a_tolerating_pod_may_use_the_tainted_node(standalone: Standalone) -> None:
    _feed_node(standalone.service, _node_object("tainted", taints=TAINTED))
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}

    signed = standalone.service.schedule(_ours("p", tolerations=[toleration]))

    assert signed is not None and signed.node == "tainted"


def test_two_pods_wanting_one_host_port_never_share_a_node(standalone: Standalone) -> None:
    service = standalone.service
    _feed_node(service, _node_object("n1"))
    _feed_node(service, _node_object("n2"))

    def with_port(name: str) -> dict[str, Any]:
        pod = _ours(name)
        pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
        return pod

    placed = [service.schedule(with_port(name)) for name in ("a", "b", "c")]

    assert sorted(p.node for p in placed if p is not None) == ["n1", "n2"]
    assert placed[2] is None


UNSUPPORTED = [
    ("required pod affinity", {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "db"}}}]}}},
     "required pod affinity (spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution)"),
    ("required pod anti-affinity", {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}]}}},
     "required pod anti-affinity (spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution)"),
    ("a hard topology spread", {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}]},
     "a topology spread over topology.kubernetes.io/zone with whenUnsatisfiable: DoNotSchedule (spec.topologySpreadConstraints[0])"),
    ("a persistent volume claim", {"volumes": [{"name": "cache", "emptyDir": {}}, {"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}}]},
     "volume data from PersistentVolumeClaim data-0 (spec.volumes[1].persistentVolumeClaim)"),
    ("a generic ephemeral volume", {"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]},
     "volume scratch from a generic ephemeral volume claim (spec.volumes[0].ephemeral)"),
]


@pytest.mark.parametrize(("what", "spec", "named"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_a_pod_needing_what_standalone_cannot_check_is_refused_with_an_event_not_placed(
    standalone: Standalone, what: str, spec: dict[str, Any], named: str
) -> None:
    _feed_node(standalone.service, _node_object("n1"))
    pod = _ours("p", **spec)
    standalone.queue.add(pod)

    standalone.loop.schedule_one(pod)

    assert standalone.service.allocation_of(pods.uid(pod)) is None
    assert len(standalone.queue) == 0  # immutable on the pod: not retried
    (event,) = standalone.events
    assert (event["reason"], event["type"]) == ("FailedScheduling", "Warning")
    assert named in event["message"]
    assert "kube-scheduler profile" in event["message"]


def test_soft_constraints_are_ignored_rather_than_refused(standalone: Standalone) -> None:
    _feed_node(standalone.service, _node_object("n1"))
    soft = {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}}}
    pod = _ours(
        "p",
        affinity={"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [soft]}},
        topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {}}],
    )
    standalone.queue.add(pod)

    standalone.loop.schedule_one(pod)

    assert standalone.service.allocation_of(pods.uid(pod)) is not None
    assert [e["reason"] for e in standalone.events] == ["Scheduled"]


def test_a_pod_held_by_scheduling_gates_is_not_queued_until_they_are_removed() -> None:
    gated = _ours("p", schedulingGates=[{"name": "example.com/quota"}])
    released = _ours("p")

    assert not pods.wants_us(gated)
    assert pods.wants_us(released)


def test_the_service_reads_a_pods_tolerations_and_host_ports_for_the_node_rules(standalone: Standalone) -> None:
    pod = _ours("p", tolerations=[{"operator": "Exists"}])
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]

    needs = standalone.service.request(pod).node_needs

    assert needs.tolerations == (Toleration(operator="Exists"),)
    assert needs.host_ports == (HostPort(8080),)
