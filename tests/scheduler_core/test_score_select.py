"""Scoring strategies, weights, and the fixed tie-break order."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from apis.allocation import Allocation, GPUShare
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.policies import UnknownPolicyError
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import GiB, info, node, pod, share, whole


def _cluster(scheduler: Scheduler, used: dict[str, int], *, cpu_used: dict[str, int] | None = None) -> None:
    """Nodes of 2 GPUs; `used[name]` percent of GPU 0 (core and memory) is held on each."""
    for name, percent in used.items():
        scheduler.upsert_node_devices(node(name, 2))
        scheduler.upsert_node_info(info(name, cpu=10000, memory_gib=100))
        if percent:
            held = GPUShare(0, f"GPU-{name}-0", percent, 80 * GiB * percent // 100, percent)
            scheduler.add_pod(pod(f"held-{name}"), NodeName(name), Allocation(gpus=(held,)))
        if cpu_used and cpu_used.get(name):
            scheduler.add_pod(pod(f"cpu-{name}", cpu=cpu_used[name]), NodeName(name), None)


@dataclass(frozen=True)
class SelectCase:
    name: str
    policy: str
    used: dict[str, int]
    expected: str
    params: dict[str, float] | None = None
    cpu_used: dict[str, int] | None = None


SELECT_CASES = [
    SelectCase("binpack picks the fullest node", "binpack", {"a": 10, "b": 60, "c": 30}, "b"),
    SelectCase("spread picks the emptiest node", "spread", {"a": 10, "b": 60, "c": 30}, "a"),
    SelectCase("equal scores go to the first node by name", "binpack", {"c": 20, "a": 20, "b": 20}, "a"),
    SelectCase(
        "weights can make cpu the only thing that counts",
        "binpack",
        {"a": 60, "b": 0},
        "b",
        {"weight_gpu_core": 0, "weight_gpu_memory": 0, "weight_cpu": 1, "weight_memory": 0},
        {"b": 5000},
    ),
]


@pytest.mark.parametrize("case", SELECT_CASES, ids=[c.name for c in SELECT_CASES])
def test_select_follows_the_policy(case: SelectCase) -> None:
    scheduler = Scheduler(policy=case.policy, policy_params=case.params)
    _cluster(scheduler, case.used, cpu_used=case.cpu_used)
    assert scheduler.select(pod("p", share(20, gib=10), cpu=1000)) == case.expected


def test_scores_are_integers_0_to_100_in_the_order_asked_and_0_for_nodes_that_do_not_fit() -> None:
    scheduler = Scheduler(policy="binpack")
    _cluster(scheduler, {"a": 10, "b": 90})
    nodes = [NodeName("b"), NodeName("ghost"), NodeName("a")]
    scores = scheduler.score(pod("p", share(20, gib=10)), nodes)
    assert [name for name, _ in scores] == nodes
    by_name = {str(name): value for name, value in scores}
    assert by_name["ghost"] == 0
    # b: GPU 0 is 90% used, so a 20% share fits only GPU 1; still b is fuller overall.
    assert 0 < by_name["a"] < by_name["b"] <= 100
    assert all(isinstance(value, int) for _, value in scores)


def test_a_seeded_tie_break_is_fixed_per_seed_and_not_name_order() -> None:
    names = [f"node-{i:02d}" for i in range(20)]

    def picks(seed: int | None) -> list[str | None]:
        scheduler = Scheduler(policy="binpack", tie_break_seed=seed)
        for name in names:
            scheduler.upsert_node_devices(node(name, 1))
        chosen: list[str | None] = []
        for i in range(3):
            p = pod(f"p{i}", whole(1))
            target = scheduler.select(p)
            assert target is not None
            scheduler.reserve(p, target)
            chosen.append(target)
        return chosen

    assert picks(None) == ["node-00", "node-01", "node-02"]
    assert picks(7) == picks(7)
    assert picks(7) != picks(None)
    assert picks(7) != picks(8)


def test_node_and_gpu_policies_are_chosen_separately() -> None:
    scheduler = Scheduler(policy="binpack", gpu_policy="spread")
    _cluster(scheduler, {"a": 10, "b": 50})
    target = scheduler.select(pod("p", share(20, gib=10)))
    assert target == "b"
    allocation = scheduler.reserve(pod("p", share(20, gib=10)), NodeName("b"))
    assert allocation.gpus[0].minor == 1  # the empty GPU of the fullest node


def test_an_unknown_policy_name_lists_the_known_ones() -> None:
    with pytest.raises(
        UnknownPolicyError, match=r"unknown policy 'tetris'; choose one of: .*binpack.*spread"
    ):
        Scheduler(policy="tetris")


def test_an_unknown_weight_is_rejected_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) weight_gpu; known: weight_gpu_core"):
        Scheduler(policy="binpack", policy_params={"weight_gpu": 1})


def test_select_returns_none_when_nothing_fits() -> None:
    scheduler = Scheduler()
    _cluster(scheduler, {"a": 0})
    assert scheduler.select(pod("p", whole(4))) is None
