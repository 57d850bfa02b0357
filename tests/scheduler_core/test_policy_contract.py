"""The contract every registered policy keeps, in live scheduling and in the simulator.

Runs over the registry, not a list: the core's `policy_*.py` modules and the plug-in
package of these tests (`plugin_policies/`, discovered below as a plug-in would be),
so a new policy module is covered without being named anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from scheduler_plugin.core import policies
from scheduler_plugin.core.api import PodRequest
from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import Demand
from scheduler_plugin.core.policies import PolicyContext, make_policy, policy_spec
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.replay import replay
from scheduler_plugin.sim.trace import read_nodes, read_pods
from tests.scheduler_core.builders import info, node, pod, share, whole
from tests.simulator.helpers import NODES_CSV, PODS_CSV

PLUGINS = "tests.scheduler_core.plugin_policies"
policies.discover(PLUGINS)
REGISTERED = policies.policy_names()

#: pods of every kind the core hands a policy: shares (one and two cards, by ratio and by bytes),
#: whole GPUs, a model-restricted pod, a CPU-only pod, and one that fits nowhere
PODS: tuple[PodRequest, ...] = (
    pod("share-10", share(10), cpu=1000),
    pod("share-30-bytes", share(30, gib=20), cpu=2000, memory_gib=8),
    pod("share-50", share(50), cpu=4000),
    pod("two-halves", share(50, cards=2), cpu=2000),
    pod("whole-1", whole(1), cpu=8000, memory_gib=32),
    pod("whole-2", whole(2), cpu=4000),
    pod("t4-only", share(40), use=("T4",)),
    pod("cpu-only", cpu=6000, memory_gib=16),
    pod("share-70", share(70), cpu=1000),
    pod("whole-4", whole(4)),
    pod("too-big", whole(16)),
    pod("share-20", share(20), cpu=500),
)


def _cluster(scheduler: Scheduler) -> None:
    for name, count, model, cpu in (("a", 4, "A100-SXM4-80GB", 32000), ("b", 8, "A100-SXM4-80GB", 96000), ("t", 2, "T4", 16000)):
        scheduler.upsert_node_devices(node(name, count, model=model, memory_gib=16 if model == "T4" else 80))
        scheduler.upsert_node_info(info(name, cpu=cpu, memory_gib=256))


def _grow(scheduler: Scheduler, count: int) -> None:
    """More nodes than the state's first arrays hold, so policies with caches see a resize."""
    for i in range(count):
        name = f"extra-{i:03d}"
        scheduler.upsert_node_devices(node(name, 1))
        scheduler.upsert_node_info(info(name, cpu=8000, memory_gib=64))


def _record_raw_scores(scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> list[npt.NDArray[Any]]:
    seen: list[npt.NDArray[Any]] = []
    original = scheduler.node_policy.score

    def score(nodes: npt.NDArray[np.intp], demand: Demand, fits: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
        result = original(nodes, demand, fits)
        seen.append(np.asarray(result))
        assert np.shape(result) == (len(nodes),)
        return result

    monkeypatch.setattr(scheduler.node_policy, "score", score)
    return seen


def _schedule(scheduler: Scheduler, pods: Sequence[PodRequest]) -> list[tuple[str, tuple[str, ...]] | None]:
    """Every pod through filter, score, select, reserve and confirm, checking what each step says."""
    placements: list[tuple[str, tuple[str, ...]] | None] = []
    for request in pods:
        verdicts = scheduler.filter(request)
        feasible = [v.node_name for v in verdicts if v.feasible]
        scores = scheduler.score(request, feasible)
        assert [name for name, _ in scores] == feasible
        assert all(isinstance(s, int) and 0 <= s <= 100 for _, s in scores), scores
        chosen = scheduler.select(request)
        if not feasible:
            assert chosen is None, f"{request.name}: selected {chosen} though no node passed the filter"
            placements.append(None)
            continue
        assert chosen in feasible, f"{request.name}: selected {chosen}, not among {feasible}"
        allocation = scheduler.reserve(request, chosen)
        scheduler.confirm(request.uid)
        cards = request.device.gpus if request.device else 0
        uuids = tuple(s.uuid for s in allocation.gpus)
        assert len(uuids) == len(set(uuids)) == cards, f"{request.name}: {uuids} for {cards} card(s)"
        placements.append((str(chosen), uuids))
    return placements


def _assert_within_capacity(scheduler: Scheduler) -> None:
    for view in scheduler.node_views():
        for gpu in view.gpus:
            assert gpu.allocated_core_percent <= 100, (view.name, gpu.device.uuid, gpu.allocated_core_percent)
            assert gpu.allocated_memory_bytes <= gpu.device.memory_bytes, (view.name, gpu.device.uuid)


def _live(name: str, params: Mapping[str, float] | None = None) -> list[tuple[str, tuple[str, ...]] | None]:
    scheduler = Scheduler(policy=name, tie_break_seed=3, policy_params=params)
    _cluster(scheduler)
    first = _schedule(scheduler, PODS[:6])
    _grow(scheduler, 70)
    return first + _schedule(scheduler, PODS[6:])


def test_the_contract_covers_the_core_and_the_plug_in_policies() -> None:
    assert {"fgpu", "binpack", "firstfit"} <= set(REGISTERED)
    assert policies.DEFAULT_POLICY in REGISTERED


@pytest.mark.parametrize("name", REGISTERED)
def test_a_policy_declares_its_name_what_it_does_and_what_it_takes(name: str) -> None:
    spec = policy_spec(name)

    assert (spec.name, spec.score != "", spec.share_gpu != "") == (name, True, True)
    assert spec.builtin == spec.module.startswith("scheduler_plugin.core.policy_")
    spec.parse_params({})  # the defaults pass the declaration's own rules
    spec.parse_options({})
    for param in spec.params:
        if param.default is not None:
            assert param.check(param.default, policy=name) == param.default
    policy = make_policy(name, context=PolicyContext(state=ClusterState()))
    assert policy.name == name


@pytest.mark.parametrize("name", REGISTERED)
def test_a_policy_refuses_a_parameter_it_did_not_declare_naming_the_ones_it_did(name: str) -> None:
    known = ", ".join(policy_spec(name).param_names) or "none"
    with pytest.raises(ValueError, match=rf"policy '{name}': unknown parameter\(s\) no_such_knob; known: {known}"):
        make_policy(name, context=PolicyContext(state=ClusterState(), params={"no_such_knob": 1.0}))


@pytest.mark.parametrize("name", REGISTERED)
def test_a_policy_places_every_kind_of_pod_within_capacity_in_live_scheduling(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = Scheduler(policy=name, tie_break_seed=3)
    raw = _record_raw_scores(scheduler, monkeypatch)
    _cluster(scheduler)

    placements = _schedule(scheduler, PODS[:6])
    _grow(scheduler, 70)
    placements += _schedule(scheduler, PODS[6:])

    placed = {request.uid for request, where in zip(PODS, placements, strict=True) if where is not None}
    assert "uid-too-big" not in placed and len(placed) >= len(PODS) // 2
    assert raw and all(np.isfinite(r).all() and (r >= 0).all() and (r <= 100).all() for r in raw), raw
    _assert_within_capacity(scheduler)
    for request in PODS:  # every reservation was confirmed: unreserve leaves bound pods alone
        scheduler.unreserve(request.uid)
        scheduler.unreserve(request.uid)
    assert set(scheduler.pod_uids()) == placed


@pytest.mark.parametrize("name", REGISTERED)
def test_a_policy_decides_the_same_twice_with_the_same_seed(name: str) -> None:
    assert _live(name) == _live(name)


@pytest.mark.parametrize("name", REGISTERED)
def test_a_policy_given_its_declared_defaults_decides_as_without_them(name: str) -> None:
    defaults = {p.name: p.default for p in policy_spec(name).params if p.default is not None}

    assert _live(name, defaults) == _live(name)


@pytest.mark.parametrize("name", REGISTERED)
def test_a_policy_replays_a_tiny_trace_in_the_simulator(name: str) -> None:
    nodes, pods = read_nodes(NODES_CSV), read_pods(PODS_CSV)

    first = replay(nodes=nodes, pods=pods, policy=name, seed=5)
    second = replay(nodes=nodes, pods=pods, policy=name, seed=5)

    assert first.placed + first.failed == first.pods > 0
    assert first.placed > 0
    assert 0 <= first.alloc_at_100 <= 100
    arrived, alloc = first.records.arrived_pct, first.records.alloc_pct
    assert list(arrived) == sorted(arrived)
    assert all(0 <= a <= b + 0.01 for a, b in zip(alloc, arrived, strict=True))
    assert (first.records.arrived_pct, first.records.alloc_pct) == (second.records.arrived_pct, second.records.alloc_pct)
    assert np.array_equal(first.records.frag_pct, second.records.frag_pct, equal_nan=True)

