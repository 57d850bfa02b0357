"""A node whose agent says its isolation backend cannot enforce a share (FgpuIsolationReady=False)
gets no GPU share from the scheduler, while whole GPUs and CPU pods still land there."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from apis import names
from scheduler_plugin import pods
from scheduler_plugin.core.api import NodeName, PodRequest
from scheduler_plugin.core.noderules import NodeRules, PodNodeNeeds, Toleration, node_rules
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import info, node, pod, share, whole

BROKEN = {
    "type": names.ISOLATION_READY_CONDITION,
    "status": "False",
    "reason": "LibraryMissing",
    "message": "libvgpu.so is not at /usr/local/vgpu/libvgpu.so",
}
EXPECTED = (
    "node cannot enforce GPU share limits (condition FgpuIsolationReady=False, LibraryMissing: "
    "libvgpu.so is not at /usr/local/vgpu/libvgpu.so); whole GPUs still fit there"
)


def _node(name: str, *conditions: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, *conditions]},
    }


def _cluster(**objs: dict[str, Any]) -> Scheduler:
    scheduler = Scheduler()
    for name, obj in objs.items():
        scheduler.upsert_node_devices(node(name, 2))
        scheduler.upsert_node_info(replace(info(name), rules=node_rules(obj)))
    return scheduler


def _share(name: str = "p", tolerations: tuple[Toleration, ...] = ()) -> PodRequest:
    return replace(pod(name, share(50, gib=10)), node_needs=PodNodeNeeds(tolerations=tolerations, needs_limits=True))


def test_only_a_false_condition_marks_a_node_unable_to_limit_shares() -> None:
    assert node_rules(_node("n1", BROKEN)).limits_unenforced == EXPECTED
    for status in ("True", "Unknown"):
        assert node_rules(_node("n1", {**BROKEN, "status": status})).limits_unenforced == ""
    assert node_rules(_node("n1")).limits_unenforced == ""  # an agent that never reported: its hook still refuses


def test_a_share_goes_to_the_node_that_can_limit_it_and_says_why_not_the_other() -> None:
    scheduler = _cluster(broken=_node("broken", BROKEN), ok=_node("ok"))

    verdicts = {v.node_name: v for v in scheduler.filter(_share())}

    assert verdicts[NodeName("ok")].feasible
    refused = verdicts[NodeName("broken")]
    assert (refused.feasible, refused.reason, refused.unresolvable) == (False, EXPECTED, True)
    assert refused == scheduler.explain_node(_share(), NodeName("broken"))
    assert scheduler.select(_share()) == "ok"


@pytest.mark.parametrize(
    "request_",
    [
        replace(pod("w", whole(1)), node_needs=PodNodeNeeds()),
        replace(pod("cpu", None, cpu=500), node_needs=PodNodeNeeds()),
    ],
    ids=["whole GPU", "CPU only"],
)
def test_whole_gpus_and_cpu_pods_still_land_on_a_node_that_cannot_limit_shares(request_: PodRequest) -> None:
    scheduler = _cluster(broken=_node("broken", BROKEN))

    (verdict,) = scheduler.filter(request_)

    assert verdict.feasible, verdict.reason


def test_tolerating_every_taint_does_not_switch_the_rule_off() -> None:
    scheduler = _cluster(broken=_node("broken", BROKEN))

    (verdict,) = scheduler.filter(_share(tolerations=(Toleration("", "Exists"),)))

    assert not verdict.feasible and verdict.reason == EXPECTED


def test_the_rule_lifts_when_the_agent_reports_the_backend_ready_again() -> None:
    scheduler = _cluster(broken=_node("broken", BROKEN))
    scheduler.upsert_node_info(replace(info("broken"), rules=node_rules(_node("broken", {**BROKEN, "status": "True"}))))

    (verdict,) = scheduler.filter(_share())

    assert verdict.feasible


def test_bulk_reasons_equal_each_node_explained_alone() -> None:
    objs = {f"n{i}": _node(f"n{i}", BROKEN) if i % 3 == 0 else _node(f"n{i}") for i in range(30)}
    scheduler = _cluster(**objs)

    verdicts = scheduler.filter(_share())

    assert sum(not v.feasible for v in verdicts) == 10
    for verdict in verdicts:
        assert verdict == scheduler.explain_node(_share(), verdict.node_name)


def _pod_dict(resources: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": resources, "requests": resources}}]},
    }


def test_a_pod_needs_limits_when_it_asks_for_a_share_not_for_whole_gpus() -> None:
    shared = pods.request_of(_pod_dict({names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}), rules=None)
    entire = pods.request_of(_pod_dict({names.GPU_CORE: "100", names.GPU_MEMORY_RATIO: "100"}), rules=None)
    cpu = pods.request_of(_pod_dict({"cpu": "1"}), rules=None)

    assert shared.node_needs.needs_limits
    assert not entire.node_needs.needs_limits
    assert not cpu.node_needs.needs_limits


def test_rules_from_an_embedded_store_without_node_objects_limit_nothing() -> None:
    assert NodeRules().limits_unenforced == ""
