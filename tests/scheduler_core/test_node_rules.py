"""Node rules (taints, cordon, conditions, max pods, host ports): read from API objects, checked by the
core's filter with kube-scheduler's semantics, and explained in words."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from apis import names
from scheduler_plugin.core.api import NodeInfo, NodeName, PodRequest, SchedulingError
from scheduler_plugin.core.noderules import (
    HostPort,
    NodeRules,
    PodNodeNeeds,
    Taint,
    Toleration,
    node_rules,
    pod_needs,
)
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import info, node, pod, share


def _node(
    *,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
    conditions: dict[str, str] | None = None,
    pods: str | None = "110",
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [{"type": t, "status": s} for t, s in (conditions or {"Ready": "True"}).items()],
        "allocatable": {"cpu": "64", "memory": "512Gi", **({"pods": pods} if pods is not None else {})},
    }
    spec: dict[str, Any] = {"taints": list(taints or [])}
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "spec": spec, "status": status}


# --- reading Node objects ---------------------------------------------------------------------


def test_a_ready_untainted_node_has_no_rules_but_its_pod_capacity() -> None:
    assert node_rules(_node()) == NodeRules(taints=(), max_pods=110)


def test_a_node_without_pod_capacity_or_conditions_is_not_refused_for_them() -> None:
    bare = {"metadata": {"name": "n1"}}

    assert node_rules(bare) == NodeRules()
    assert node_rules(_node(pods=None)).max_pods == 0


@pytest.mark.parametrize(
    ("obj", "key", "cause"),
    [
        (_node(unschedulable=True), names.TAINT_UNSCHEDULABLE, "node is cordoned (spec.unschedulable)"),
        (_node(conditions={"Ready": "False"}), names.TAINT_NOT_READY, "node is not ready (condition Ready=False)"),
        (_node(conditions={"Ready": "Unknown"}), names.TAINT_UNREACHABLE, "node is unreachable (condition Ready=Unknown)"),
        (
            _node(conditions={"Ready": "True", "NetworkUnavailable": "True"}),
            names.TAINT_NETWORK_UNAVAILABLE,
            "node's network is unavailable (condition NetworkUnavailable=True)",
        ),
    ],
    ids=["cordoned", "not-ready", "unreachable", "network-unavailable"],
)
def test_cordon_and_bad_conditions_read_as_the_no_schedule_taints_kubernetes_derives_from_them(
    obj: dict[str, Any], key: str, cause: str
) -> None:
    assert node_rules(obj).taints == (Taint(key, effect="NoSchedule", cause=cause),)


def test_only_no_schedule_and_no_execute_taints_count_and_a_controller_copy_is_not_doubled() -> None:
    obj = _node(
        conditions={"Ready": "False"},
        taints=[
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "soft", "effect": "PreferNoSchedule"},
            {"key": "evict", "value": "x", "effect": "NoExecute"},
            {"key": names.TAINT_NOT_READY, "effect": "NoSchedule"},  # what the lifecycle controller adds
            {"key": names.TAINT_NOT_READY, "effect": "NoExecute"},
        ],
    )

    assert [str(t) for t in node_rules(obj).taints] == [
        f"{names.TAINT_NOT_READY}:NoSchedule",
        "dedicated=gpu:NoSchedule",
        "evict=x:NoExecute",
        f"{names.TAINT_NOT_READY}:NoExecute",
    ]


# --- tolerations and host ports -----------------------------------------------------------------


@dataclass(frozen=True)
class Tol:
    name: str
    toleration: Toleration
    taint: Taint
    tolerated: bool


TOLERATIONS = [
    Tol("equal key and value", Toleration("dedicated", "Equal", "gpu", "NoSchedule"), Taint("dedicated", "gpu"), True),
    Tol("equal with another value", Toleration("dedicated", "Equal", "cpu", "NoSchedule"), Taint("dedicated", "gpu"), False),
    Tol("exists ignores the value", Toleration("dedicated", "Exists"), Taint("dedicated", "gpu"), True),
    Tol("empty effect matches every effect", Toleration("dedicated", "Exists"), Taint("dedicated", "", "NoExecute"), True),
    Tol("another effect", Toleration("dedicated", "Exists", effect="NoExecute"), Taint("dedicated", "gpu"), False),
    Tol("empty key with exists tolerates everything", Toleration("", "Exists"), Taint("anything", "x"), True),
    Tol("another key", Toleration("other", "Exists"), Taint("dedicated", "gpu"), False),
    Tol("operator omitted means Equal", Toleration("dedicated", "", "gpu"), Taint("dedicated", "gpu"), True),
    Tol("an unknown operator tolerates nothing", Toleration("dedicated", "Gte", "1"), Taint("dedicated", "1"), False),
]


@pytest.mark.parametrize("case", TOLERATIONS, ids=lambda c: c.name)
def test_a_toleration_matches_a_taint_as_kubernetes_decides(case: Tol) -> None:
    assert case.toleration.tolerates(case.taint) is case.tolerated


@pytest.mark.parametrize(
    ("a", "b", "clash"),
    [
        (HostPort(8080), HostPort(8080), True),
        (HostPort(8080), HostPort(8081), False),
        (HostPort(8080, "UDP"), HostPort(8080, "TCP"), False),
        (HostPort(8080, ip="10.0.0.1"), HostPort(8080, ip="10.0.0.2"), False),
        (HostPort(8080, ip="10.0.0.1"), HostPort(8080), True),
        (HostPort(8080), HostPort(8080, ip="10.0.0.2"), True),
    ],
)
def test_host_ports_clash_on_the_same_port_protocol_and_an_address_in_common(a: HostPort, b: HostPort, clash: bool) -> None:
    assert a.clashes(b) is clash


def test_a_pods_needs_are_its_tolerations_and_the_host_ports_of_containers_and_sidecars() -> None:
    obj = {
        "spec": {
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists"}],
            "containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 81}]}],
            "initContainers": [
                {"name": "setup", "ports": [{"containerPort": 90, "hostPort": 9090}]},
                {"name": "proxy", "restartPolicy": "Always", "ports": [{"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"}]},
            ],
        }
    }

    assert pod_needs(obj) == PodNodeNeeds(
        tolerations=(Toleration("dedicated", "Exists", "", "NoSchedule"), Toleration("", "Exists", "", "")),
        host_ports=(HostPort(8080), HostPort(53, "UDP", "10.0.0.1")),
    )


# --- the core's filter --------------------------------------------------------------------------


def _rules(**node: Any) -> NodeRules:
    return node_rules(_node(**node))


def _cluster(rules_by_node: dict[str, NodeRules | None]) -> Scheduler:
    scheduler = Scheduler()
    for name, rules in rules_by_node.items():
        scheduler.upsert_node_devices(node(name, 2))
        scheduler.upsert_node_info(replace(info(name), rules=rules))
    return scheduler


def _needs(*, tolerations: tuple[Toleration, ...] = (), ports: tuple[HostPort, ...] = ()) -> PodNodeNeeds:
    return PodNodeNeeds(tolerations=tolerations, host_ports=ports)


def _pod(name: str = "p", needs: PodNodeNeeds | None = None) -> PodRequest:
    return replace(pod(name, share(50, gib=10)), node_needs=needs or PodNodeNeeds())


@dataclass(frozen=True)
class Case:
    name: str
    rules: NodeRules | None
    pod: PodRequest
    reason: str  # "" = the node fits
    unresolvable: bool = True


GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]

CASES = [
    Case("a ready node fits", _rules(), _pod(), ""),
    Case("a cordoned node is refused", _rules(unschedulable=True), _pod(), "node is cordoned (spec.unschedulable)"),
    Case(
        "a pod tolerating the cordon taint may use a cordoned node",
        _rules(unschedulable=True),
        _pod(needs=_needs(tolerations=(Toleration(names.TAINT_UNSCHEDULABLE, "Exists"),))),
        "",
    ),
    Case("a not-ready node is refused", _rules(conditions={"Ready": "False"}), _pod(), "node is not ready (condition Ready=False)"),
    Case("an unreachable node is refused", _rules(conditions={"Ready": "Unknown"}), _pod(), "node is unreachable (condition Ready=Unknown)"),
    Case(
        "a node without network is refused",
        _rules(conditions={"Ready": "True", "NetworkUnavailable": "True"}),
        _pod(),
        "node's network is unavailable (condition NetworkUnavailable=True)",
    ),
    Case(
        "an untolerated NoSchedule taint refuses the node",
        _rules(taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
        _pod(),
        "node has taint dedicated=gpu:NoSchedule the pod does not tolerate",
    ),
    Case(
        "an untolerated NoExecute taint refuses the node",
        _rules(taints=[{"key": "maintenance", "effect": "NoExecute"}]),
        _pod(),
        "node has taint maintenance:NoExecute the pod does not tolerate",
    ),
    Case("a PreferNoSchedule taint is ignored", _rules(taints=[{"key": "soft", "effect": "PreferNoSchedule"}]), _pod(), ""),
    Case(
        "a tolerated taint lets the pod on",
        _rules(taints=GPU_TAINT),
        _pod(needs=_needs(tolerations=(Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"),))),
        "",
    ),
    Case("a node whose Node object was never seen checks no rules", None, _pod(), ""),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_filter_applies_node_rules_and_says_why(case: Case) -> None:
    scheduler = _cluster({"n1": case.rules})

    (verdict,) = scheduler.filter(case.pod, [NodeName("n1")])
    alone = scheduler.explain_node(case.pod, NodeName("n1"))

    assert (verdict.feasible, verdict.reason) == (not case.reason, case.reason)
    assert verdict == alone
    if case.reason:
        assert verdict.unresolvable is case.unresolvable


def test_a_node_holding_as_many_pods_as_it_allows_is_refused_until_one_leaves() -> None:
    scheduler = _cluster({"n1": NodeRules(max_pods=2)})
    for name in ("a", "b"):
        scheduler.add_pod(pod(name), NodeName("n1"), None)

    (verdict,) = scheduler.filter(_pod(), [NodeName("n1")])
    scheduler.remove_pod(pod("a").uid)
    (after,) = scheduler.filter(_pod(), [NodeName("n1")])

    assert (verdict.feasible, verdict.reason, verdict.unresolvable) == (
        False,
        "too many pods: 2 of 2 allowed (status.allocatable.pods)",
        False,
    )
    assert after.feasible


def test_a_host_port_held_by_a_pod_on_the_node_refuses_a_pod_wanting_it() -> None:
    scheduler = _cluster({"n1": NodeRules(), "n2": NodeRules()})
    scheduler.add_pod(_pod("web", _needs(ports=(HostPort(8080),))), NodeName("n1"), None)

    verdicts = scheduler.filter(_pod("p", _needs(ports=(HostPort(8080),))), [NodeName("n1"), NodeName("n2")])
    other_port = scheduler.filter(_pod("q", _needs(ports=(HostPort(9090),))), [NodeName("n1")])

    assert [(v.feasible, v.reason, v.unresolvable) for v in verdicts] == [
        (False, "host port 8080/TCP is in use on the node", False),
        (True, "", False),
    ]
    assert other_port[0].feasible


def test_a_reserved_pod_holds_its_host_port_before_it_is_bound() -> None:
    scheduler = _cluster({"n1": NodeRules()})
    scheduler.reserve(_pod("first", _needs(ports=(HostPort(8080),))), NodeName("n1"))

    (verdict,) = scheduler.filter(_pod("second", _needs(ports=(HostPort(8080),))), [NodeName("n1")])

    assert not verdict.feasible and verdict.reason == "host port 8080/TCP is in use on the node"


def test_select_places_the_pod_on_the_only_node_its_rules_allow() -> None:
    scheduler = _cluster(
        {
            "cordoned": _rules(unschedulable=True),
            "not-ready": _rules(conditions={"Ready": "False"}),
            "tainted": _rules(taints=GPU_TAINT),
            "ok": _rules(),
        }
    )

    assert scheduler.select(_pod()) == "ok"
    assert scheduler.select(_pod("q", _needs(tolerations=(Toleration("nvidia.com/gpu", "Equal", "present"),)))) in ("tainted", "ok")


def test_reserve_on_a_node_cordoned_since_the_filter_refuses_with_the_reason() -> None:
    scheduler = _cluster({"n1": _rules()})
    scheduler.upsert_node_info(replace(info("n1"), rules=_rules(unschedulable=True)))

    with pytest.raises(SchedulingError, match=r"node n1: node is cordoned \(spec.unschedulable\)"):
        scheduler.reserve(_pod(), NodeName("n1"))


def test_bulk_reasons_for_many_nodes_equal_each_node_explained_alone() -> None:
    variants: list[NodeRules | None] = [
        None,
        _rules(),
        _rules(unschedulable=True),
        _rules(conditions={"Ready": "Unknown"}),
        _rules(taints=GPU_TAINT),
        _rules(taints=[{"key": "a", "value": "1", "effect": "NoExecute"}, *GPU_TAINT]),
        NodeRules(max_pods=1),
    ]
    scheduler = _cluster({f"n{i}": variants[i % len(variants)] for i in range(40)})
    for i in range(0, 40, 3):
        scheduler.add_pod(_pod(f"holder{i}", _needs(ports=(HostPort(8080),))), NodeName(f"n{i}"), None)
    gpu_toleration = (Toleration("nvidia.com/gpu", "Exists"),)
    for request in (
        _pod(),
        _pod("t", _needs(tolerations=gpu_toleration)),
        _pod("h", _needs(tolerations=gpu_toleration, ports=(HostPort(8080),))),
        _pod("all", _needs(tolerations=(Toleration("", "Exists"),), ports=(HostPort(8080, ip="10.0.0.1"),))),
    ):
        verdicts = scheduler.filter(request)
        assert any(not v.feasible for v in verdicts)
        for verdict in verdicts:
            assert verdict == scheduler.explain_node(request, verdict.node_name), verdict


def test_embedded_nodes_without_node_facts_place_pods_as_before() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("n1", 1))
    scheduler.upsert_node_info(NodeInfo(name=NodeName("n1")))

    assert scheduler.select(_pod()) == "n1"
