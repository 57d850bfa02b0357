"""The policy registry and the plug-in contract as the core uses it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pytest

from scheduler_plugin.core.api import Code, NodeName, SchedulingError
from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import Demand
from scheduler_plugin.core.policies import (
    BasePolicy,
    BoolMatrix,
    FloatArray,
    PolicyContext,
    PolicyDiscoveryError,
    SlotArray,
    discover,
    make_policy,
    policy_names,
    policy_spec,
    register_policy,
    unregister_policy,
)
from scheduler_plugin.core.policy_utilization import UtilizationParams, UtilizationPolicy
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.core.settings import NoOptions, NoParams, Param
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


def _factory(cls: type[BasePolicy]) -> Callable[[PolicyContext, NoParams, NoOptions], BasePolicy]:
    return lambda context, params, options: cls(context)


@pytest.fixture(autouse=True)
def _plugged_in() -> Iterator[None]:
    """The two test policies, registered only while this module's tests run (they break the contract
    on purpose, so tests/scheduler_core/test_policy_contract.py must not see them)."""
    for name, cls in (("test-prefer", PreferNodeNamed), ("test-too-many", PicksTooMany)):
        register_policy(
            name, _factory(cls), params=NoParams, options=NoOptions, score="a test's", share_gpu="a test's", replace=True
        )
    yield
    unregister_policy("test-prefer")
    unregister_policy("test-too-many")


def test_builtin_policies_are_registered() -> None:
    assert {"binpack", "spread"} <= set(policy_names())


def test_registering_a_taken_name_needs_replace() -> None:
    with pytest.raises(ValueError, match="policy 'binpack' is already registered; pass replace=True"):
        register_policy(
            "binpack",
            lambda context, params, options: PicksTooMany(context),
            params=NoParams,
            options=NoOptions,
            score="",
            share_gpu="",
        )


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


def _package(root: Path, name: str, modules: dict[str, str]) -> str:
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, source in modules.items():
        (package / f"{module}.py").write_text(source)
    return name


_REGISTERS = """
from scheduler_plugin.core.policies import BasePolicy, register_policy
from scheduler_plugin.core.settings import NoOptions, NoParams

register_policy("{name}", lambda c, p, o: BasePolicy(c), params=NoParams, options=NoOptions, score="0", share_gpu="tightest")
"""


def test_discovery_imports_every_policy_module_of_a_package_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(
        tmp_path,
        "discovered_ok",
        {"policy_zero": _REGISTERS.format(name="test-zero"), "helpers": "raise RuntimeError('not a policy module')"},
    )
    try:
        found = discover(package)
        assert [(s.name, s.module, s.builtin) for s in found] == [("test-zero", f"{package}.policy_zero", False)]
        assert "test-zero" in policy_names() and "test-zero" not in policy_names(builtin_only=True)
    finally:
        unregister_policy("test-zero")


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("import no_such_module\n", r"policy module discovered_\w+\.policy_bad failed to import \(ModuleNotFoundError"),
        ("X = 1\n", r"policy module discovered_\w+\.policy_bad registered no policy; call register_policy"),
    ],
    ids=["fails to import", "registers nothing"],
)
def test_a_policy_module_that_fails_to_import_or_registers_nothing_is_an_error(
    source: str, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, f"discovered_{abs(hash(request.node.name))}", {"policy_bad": source})

    with pytest.raises(PolicyDiscoveryError, match=needle):
        discover(package)


def test_a_policy_gets_its_parameters_typed_with_the_declared_defaults() -> None:
    policy = make_policy("binpack", context=PolicyContext(state=ClusterState(), params={"weight_cpu": 0}))

    assert isinstance(policy, UtilizationPolicy)
    assert policy.params == UtilizationParams(weight_cpu=0.0)
    assert policy_spec("binpack").param_names == ("weight_gpu_core", "weight_gpu_memory", "weight_cpu", "weight_memory")


def test_an_option_of_the_wrong_type_is_refused_naming_the_type_the_policy_takes() -> None:
    with pytest.raises(TypeError, match=r"policy 'fgd': options\['workload'\] is a str; pass a TargetWorkload"):
        make_policy("fgd", context=PolicyContext(state=ClusterState(), options={"workload": "alibaba"}))


def test_options_a_policy_does_not_declare_are_left_to_the_others() -> None:
    make_policy("binpack", context=PolicyContext(state=ClusterState(), options={"workload": "not binpack's"}))


class _Loose:
    weight: float = 1.0


@dataclass(frozen=True)
class _Undocumented:
    weight: float = 1.0


@dataclass(frozen=True)
class _Text:
    mode: Annotated[str, Param("a word")] = "fast"


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        (_Loose, "its params must be a frozen dataclass"),
        (_Undocumented, r"annotate _Undocumented.weight as Annotated\[<type>, Param\(doc\)\]"),
        (_Text, "parameter mode is declared as <class 'str'> = 'fast'; declare it float or int"),
    ],
)
def test_a_policy_must_declare_its_parameters_as_typed_documented_fields(params: type[Any], needle: str) -> None:
    with pytest.raises(TypeError, match=needle):
        register_policy(
            "test-malformed", lambda c, p, o: BasePolicy(c), params=params, options=NoOptions, score="", share_gpu=""
        )
    assert "test-malformed" not in policy_names()
