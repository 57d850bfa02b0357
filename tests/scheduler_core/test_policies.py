"""The policy registry and the plug-in contract as the core uses it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from scheduler_plugin.core.api import Code, NodeName, SchedulingError
from scheduler_plugin.core.demand import Demand
from scheduler_plugin.core.policies import (
    BasePolicy,
    BoolMatrix,
    FloatArray,
    PolicyContext,
    SlotArray,
    make_policy,
    policy_names,
    register_policy,
)
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import node, pod, share


class PreferNodeNamed(BasePolicy):
    """Scores one node 100 and the rest 0; records what the core told it."""

    name = "test-prefer"

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self.target = str(context.options["target"])
        self.changed: list[int] = []

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        assert fits.shape == (len(nodes), self.state.max_gpus)
        names = [self.state.names[n] for n in nodes]
        return np.array([100.0 if name == self.target else 0.0 for name in names])

    def choose_share_gpus(self, node: int, demand: Demand, fitting: SlotArray) -> Sequence[int]:
        return [int(fitting[-1])]  # the highest fitting GPU, to see the choice is the policy's

    def node_changed(self, node: int) -> None:
        self.changed.append(node)


class PicksTooMany(BasePolicy):
    name = "test-too-many"

    def choose_share_gpus(self, node: int, demand: Demand, fitting: SlotArray) -> Sequence[int]:
        return [int(g) for g in fitting]


register_policy("test-prefer", PreferNodeNamed, replace=True)
register_policy("test-too-many", PicksTooMany, replace=True)


def test_builtin_policies_are_registered() -> None:
    assert {"binpack", "spread"} <= set(policy_names())


def test_registering_a_taken_name_needs_replace() -> None:
    with pytest.raises(ValueError, match="policy 'binpack' is already registered; pass replace=True"):
        register_policy("binpack", PicksTooMany)


def test_a_plugged_in_policy_scores_nodes_and_chooses_gpus() -> None:
    scheduler = Scheduler(policy="test-prefer", policy_options={"target": "n2"})
    for name in ("n1", "n2", "n3"):
        scheduler.upsert_node_devices(node(name, 4))
    request = pod("p", share(10, gib=1))
    assert scheduler.select(request) == "n2"
    assert scheduler.score(request, [NodeName("n1"), NodeName("n2")]) == [("n1", 0), ("n2", 100)]
    allocation = scheduler.reserve(request, NodeName("n2"))
    assert allocation.gpus[0].minor == 3
    policy = scheduler.node_policy
    assert isinstance(policy, PreferNodeNamed)
    assert scheduler.state.slot_of["n2"] in policy.changed


def test_a_policy_choosing_the_wrong_number_of_gpus_is_an_error() -> None:
    scheduler = Scheduler(policy="binpack", gpu_policy="test-too-many")
    scheduler.upsert_node_devices(node("n1", 4))
    with pytest.raises(SchedulingError) as caught:
        scheduler.reserve(pod("p", share(10, gib=1)), NodeName("n1"))
    assert caught.value.status.code is Code.ERROR
    assert "policy 'test-too-many' chose GPU slots [0, 1, 2, 3] for 1 card(s)" in str(caught.value)


def test_make_policy_gives_a_fresh_instance_each_time() -> None:
    scheduler = Scheduler()
    context = PolicyContext(state=scheduler.state, options={"target": "x"})
    assert make_policy("test-prefer", context=context) is not make_policy("test-prefer", context=context)
