"""Scoring and GPU-choice policies, plugged in by name.

A policy answers two questions for the core, both over the struct-of-arrays
`ClusterState` (see `cluster.py` for how to read it):

* **score** a batch of nodes that passed the filter, 0..100, higher is better::

      score(nodes, demand, fits) -> float64 array, one score per entry of `nodes`

  `nodes` are node slots; `fits[i, g]` says whether GPU slot `g` of `nodes[i]`
  can take one card of the demand (for a share: enough free core and memory,
  allowed model, healthy; for whole GPUs: entirely free). Scores may be
  fractional: the core compares them unrounded and rounds only when it reports
  them. Among equal top scores the core picks by a fixed per-run node order
  (a seeded shuffle when `tie_break_seed` is set, otherwise node name order),
  so a policy never breaks ties itself.

* **choose the GPUs** of a share on the chosen node::

      choose_share_gpus(node, demand, fitting) -> demand.gpus distinct GPU slots

  `fitting` holds the GPU slots (ascending) that can each take one card. A
  packing policy takes the tightest; FGD tries each and keeps the one that
  fragments least. Whole-GPU requests are placed by the core itself
  (topology: NVLink group, then PCIe root, then NUMA node; partition tables),
  because any entirely free GPU is the same to a scoring policy.

A policy that keeps caches per node is told when a node's row changed
(`node_changed(slot)`, also for a released slot) and when the arrays were
reallocated (`state_resized()`), and of every pod the core takes in, reserved
or already bound (`pod_added(demand)`: what a policy learns its workload from).
Subclass `BasePolicy` to get no-op hooks and
the packing GPU choice.

Policies are made by factories registered under a name::

    register_policy("mine", lambda ctx: MyPolicy(ctx))
    make_policy("mine", context=PolicyContext(state=state))

`PolicyContext.params` carries numeric knobs (weights), `options` anything else
a policy needs (the simulator passes its target workload to "fgd"), `seed` the
run's seed for policies that draw random numbers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import Demand

FloatArray = npt.NDArray[np.float64]
SlotArray = npt.NDArray[np.intp]
BoolMatrix = npt.NDArray[np.bool_]

#: Highest score a node can get.
MAX_SCORE = 100.0

#: Modules that register the built-in policies when imported. Imported on first
#: use of the registry so `make_policy("fgd")` works without the caller
#: knowing where "fgd" lives.
_BUILTIN_MODULES = (
    "scheduler_plugin.core.policy_utilization",
    "scheduler_plugin.core.policy_baselines",
    "scheduler_plugin.core.policy_fgd",
    "scheduler_plugin.core.policy_fgpu",
)


class UnknownPolicyError(ValueError):
    """A policy name nobody registered."""


@dataclass(frozen=True)
class PolicyContext:
    """What a policy factory gets."""

    state: ClusterState
    #: numeric knobs, e.g. {"weight_gpu_core": 1, "weight_cpu": 0}; unknown keys are an error of the policy
    params: Mapping[str, float] = field(default_factory=dict)
    #: anything else a policy needs (e.g. the simulator's target workload for "fgd")
    options: Mapping[str, Any] = field(default_factory=dict)
    #: the run's seed, for policies that draw random numbers
    seed: int | None = None


class Policy(Protocol):
    """A node scorer and share-GPU chooser (see the module docstring)."""

    name: str

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray: ...

    def choose_share_gpus(self, node: int, demand: Demand, fitting: SlotArray) -> Sequence[int]: ...

    def node_changed(self, node: int) -> None: ...

    def state_resized(self) -> None: ...

    def pod_added(self, demand: Demand) -> None: ...


PolicyFactory = Callable[[PolicyContext], Policy]


class BasePolicy:
    """Defaults for policies: no caches, and shares packed onto the tightest GPU."""

    name = "base"

    def __init__(self, context: PolicyContext) -> None:
        self.context = context
        self.state = context.state

    def score(self, nodes: SlotArray, demand: Demand, fits: BoolMatrix) -> FloatArray:
        return np.zeros(len(nodes), dtype=np.float64)

    def choose_share_gpus(self, node: int, demand: Demand, fitting: SlotArray) -> Sequence[int]:
        return tightest_gpus(self.state, node, demand, fitting)

    def node_changed(self, node: int) -> None:
        return None

    def pod_added(self, demand: Demand) -> None:
        return None

    def state_resized(self) -> None:
        return None


def gpu_leftover(state: ClusterState, node: int, demand: Demand, gpus: SlotArray) -> FloatArray:
    """Fraction of each GPU (core and memory averaged) still free after one card of the demand lands on it."""
    core_total = np.maximum(state.core_total[node, gpus], 1)
    mem_total = np.maximum(state.mem_total[node, gpus], 1)
    core_left = (state.core_free[node, gpus] - demand.core_need()) / core_total
    mem_left = (state.mem_free[node, gpus] - demand.memory_need(state.mem_total[node, gpus])) / mem_total
    result: FloatArray = (core_left + mem_left) / 2.0
    return result


def tightest_gpus(state: ClusterState, node: int, demand: Demand, fitting: SlotArray) -> list[int]:
    """The `demand.gpus` fitting GPUs left fullest by the placement (lowest slot on ties)."""
    order = np.lexsort((fitting, gpu_leftover(state, node, demand, fitting)))
    return [int(fitting[i]) for i in order[: demand.gpus]]


def loosest_gpus(state: ClusterState, node: int, demand: Demand, fitting: SlotArray) -> list[int]:
    """The `demand.gpus` fitting GPUs left emptiest by the placement (lowest slot on ties)."""
    order = np.lexsort((fitting, -gpu_leftover(state, node, demand, fitting)))
    return [int(fitting[i]) for i in order[: demand.gpus]]


_REGISTRY: dict[str, PolicyFactory] = {}
_builtins_loaded = False


def register_policy(name: str, factory: PolicyFactory, *, replace: bool = False) -> None:
    """Makes `make_policy(name, ...)` call `factory`. Registering a taken name needs `replace=True`."""
    if not name or name != name.strip():
        raise ValueError(f"policy name {name!r} is empty or padded; use a plain word such as 'binpack'")
    if name in _REGISTRY and not replace and _REGISTRY[name] is not factory:
        raise ValueError(f"policy {name!r} is already registered; pass replace=True to override it")
    _REGISTRY[name] = factory


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for module in _BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            # A built-in that is not part of this build; any other import error is a bug to surface.
            if error.name != module:
                raise


def policy_names() -> list[str]:
    """Every registered policy name, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def make_policy(name: str, *, context: PolicyContext) -> Policy:
    """A new policy instance; UnknownPolicyError lists the names that exist."""
    _load_builtins()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise UnknownPolicyError(f"unknown policy {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}")
    return factory(context)
