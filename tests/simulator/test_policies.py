"""Hand-built clusters where the right answer is known, decided by the real core."""

from __future__ import annotations

import pytest

from scheduler_plugin.core.policies import make_policy, policy_names
from scheduler_plugin.sim.replay import place
from tests.simulator.helpers import ALL_POLICIES, PACKING_POLICIES, cluster, gpus_of, node, occupy, pod


def test_every_simulator_policy_is_registered_with_the_core() -> None:
    assert set(ALL_POLICIES) <= set(policy_names())


@pytest.mark.parametrize("policy", PACKING_POLICIES)
def test_a_fractional_pod_does_not_split_the_free_gpu_a_whole_gpu_pod_needs_next(policy: str) -> None:
    core = cluster(policy, [node("a", gpus=1), node("b", gpus=1)])
    occupy(core, "a", [50])
    share = pod("share", milli=300)
    whole = pod("whole", milli=1000)
    assert place(core, share) == "a"
    assert place(core, whole) == "b"


@pytest.mark.parametrize("policy", PACKING_POLICIES)
def test_a_share_goes_to_the_partly_used_gpu_of_the_node(policy: str) -> None:
    core = cluster(policy, [node("a", gpus=4)])
    occupy(core, "a", [0, 0, 60, 0])
    share = pod("share", milli=400)
    assert place(core, share) == "a"
    assert gpus_of(core, share) == ("a", (2,))


@pytest.mark.parametrize("policy", ["fgd", "fgpu"])
def test_a_cpu_only_pod_does_not_strand_a_free_gpu_by_taking_its_cpu(policy: str) -> None:
    # b's GPU needs b's last 4 cores for the typical whole-GPU pod; a has no free GPU left.
    core = cluster(policy, [node("a", gpus=1, cpu=8000), node("b", gpus=1, cpu=4000)])
    occupy(core, "a", [100])
    cpu_pod = pod("cpu", cpu=2000)
    assert place(core, cpu_pod) == "a"
    assert place(core, pod("whole", milli=1000, cpu=4000)) == "b"


@pytest.mark.parametrize("policy", ["fgd", "fgpu"])
def test_a_one_gpu_pod_keeps_an_idle_eight_gpu_node_whole(policy: str) -> None:
    core = cluster(policy, [node("big", gpus=8), node("small", gpus=2)])
    occupy(core, "small", [100, 0])
    assert place(core, pod("one", milli=1000)) == "small"
    assert place(core, pod("eight", milli=1000, gpus=8)) == "big"


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_no_policy_places_a_pod_where_it_does_not_fit(policy: str) -> None:
    core = cluster(
        policy,
        [
            node("t4", gpus=2, model="T4"),
            node("cpu-short", gpus=2, cpu=1000),
            node("full", gpus=1),
        ],
    )
    occupy(core, "full", [100])
    occupy(core, "t4", [0, 90])
    assert place(core, pod("spec", milli=1000, spec=("G2",), cpu=500)) == "cpu-short"
    assert place(core, pod("no-room", milli=1000, gpus=2, cpu=500)) is None
    assert place(core, pod("fits-t4-only", milli=1000, cpu=2000)) == "t4"
    assert gpus_of(core, pod("fits-t4-only")) == ("t4", (0,))
    assert place(core, pod("too-big-share", milli=200, cpu=500)) in {"cpu-short"}


def test_unknown_policy_parameters_are_ignored_only_where_documented() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("no-such-policy", context=None)  # type: ignore[arg-type]
