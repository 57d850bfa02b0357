"""Scoring and GPU-choice policies: the plug-in contract and the registry that finds them.

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
Subclass `BasePolicy` to get no-op hooks and the packing GPU choice.

**Adding a policy is one module**, `scheduler_plugin/core/policy_<name>.py`, that
registers itself when imported, declaring what it takes (see `settings.py`)::

    @dataclass(frozen=True)
    class MineParams:
        weight: Annotated[float, settings.Param("how much free GPU counts")] = 1.0

    register_policy(
        "mine",
        lambda context, params, options: MinePolicy(context, params),
        params=MineParams,
        options=settings.NoOptions,
        score="what a node's score measures",
        share_gpu="which GPU a share gets",
    )

The module calls `register_policy` itself: the registry records the calling
module as the policy's home. The docs' policy tables are then regenerated
(`FGPU_UPDATE_DOCS=1` on tests/scheduler_core/test_policy_docs.py).

The registry imports every `policy_*.py` of this package on first use (a module
that fails to import or registers nothing is an error, not a silent drop), so
nothing else lists the policies: the service's config, `fgpuctl`, the benchmarks,
the tests and the documentation tables all read `policy_specs()`. `make_policy`
turns the raw `PolicyContext.params` (numbers by name, as a config file gives
them) and `options` (anything else, e.g. the simulator's target workload for
"fgd") into the policy's declared dataclasses, refusing unknown parameters and
wrong types or ranges with the policy, the key, the value and the fix, before the
factory runs. Options are shared by the node- and GPU-level policy, so a policy
takes the ones it declares and ignores the rest.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from scheduler_plugin.core import settings
from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import Demand
from scheduler_plugin.core.settings import OptionSpec, ParamSpec

FloatArray = npt.NDArray[np.float64]
SlotArray = npt.NDArray[np.intp]
BoolMatrix = npt.NDArray[np.bool_]

#: Highest score a node can get.
MAX_SCORE = 100.0

#: The policy of the scheduler service (`policy:` in its config) and of a core built without one.
DEFAULT_POLICY: Final = "fgpu"

#: The package whose `policy_*.py` modules are the built-in policies.
BUILTIN_PACKAGE: Final = "scheduler_plugin.core"


class UnknownPolicyError(ValueError):
    """A policy name nobody registered."""


class PolicyDiscoveryError(ImportError):
    """A `policy_*.py` module failed to import or registered no policy."""


@dataclass(frozen=True)
class PolicyContext:
    """What a policy factory gets besides its parsed parameters and options."""

    state: ClusterState
    #: numeric knobs as given, e.g. {"weight_gpu_core": 1, "weight_cpu": 0}; parsed against the
    #: policy's declared parameters by `make_policy`
    params: Mapping[str, float] = field(default_factory=dict)
    #: anything else as given (e.g. the simulator's target workload for "fgd"); each policy takes
    #: the options it declares
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


ParamsT = TypeVar("ParamsT")
OptionsT = TypeVar("OptionsT")


@dataclass(frozen=True)
class PolicySpec(Generic[ParamsT, OptionsT]):
    """What a policy declares when it registers: everything the rest of fgpu knows of it."""

    name: str
    #: builds an instance from the context and the parsed parameters and options
    factory: Callable[[PolicyContext, ParamsT, OptionsT], Policy]
    params_type: type[ParamsT]
    options_type: type[OptionsT]
    params: tuple[ParamSpec, ...]
    options: tuple[OptionSpec, ...]
    #: what a node's score measures (one line, for the docs and `fgpuctl`)
    score: str
    #: which of a node's fitting GPUs a share gets
    share_gpu: str
    #: rules across parameters that the parameters' own lines do not say (e.g. "not all may be 0")
    notes: str
    #: the module that registered it
    module: str

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def builtin(self) -> bool:
        """Registered by a `policy_*.py` module of the core package (not by a test or a plug-in)."""
        return self.module.startswith(f"{BUILTIN_PACKAGE}.policy_")

    def parse_params(self, raw: Mapping[str, object]) -> ParamsT:
        """ValueError naming this policy, the key, the value and the fix."""
        return settings.parse_params(self.params_type, self.params, raw, policy=self.name)

    def parse_options(self, raw: Mapping[str, object]) -> OptionsT:
        """TypeError naming this policy, the option, its type and the type it takes."""
        return settings.parse_options(self.options_type, self.options, raw, policy=self.name)

    def make(self, context: PolicyContext) -> Policy:
        return self.factory(context, self.parse_params(context.params), self.parse_options(context.options))


_REGISTRY: dict[str, PolicySpec[Any, Any]] = {}
_discovered = False
_discovering = False


def register_policy(
    name: str,
    factory: Callable[[PolicyContext, ParamsT, OptionsT], Policy],
    *,
    params: type[ParamsT],
    options: type[OptionsT],
    score: str,
    share_gpu: str,
    notes: str = "",
    replace: bool = False,
) -> PolicySpec[ParamsT, OptionsT]:
    """Makes `make_policy(name, ...)` parse the context's params into `params` and its options into
    `options`, then call `factory(context, params, options)`.

    A name taken by another module needs `replace=True` (the same module may register again, as
    when it is reloaded). TypeError when `params` or `options` is not a frozen dataclass of declared fields.
    """
    if not name or name != name.strip():
        raise ValueError(f"policy name {name!r} is empty or padded; use a plain word such as 'binpack'")
    module = str(sys._getframe(1).f_globals.get("__name__", ""))
    spec = PolicySpec(
        name=name,
        factory=factory,
        params_type=params,
        options_type=options,
        params=settings.param_specs(params, policy=name),
        options=settings.option_specs(options, policy=name),
        score=score,
        share_gpu=share_gpu,
        notes=notes,
        module=module,
    )
    existing = _REGISTRY.get(name)
    if existing is not None and not replace and existing.module != module:
        raise ValueError(f"policy {name!r} is already registered; pass replace=True to override it")
    _REGISTRY[name] = spec
    return spec


def unregister_policy(name: str) -> None:
    """Forgets a policy (a plug-in's or a test's); unknown names are fine."""
    _REGISTRY.pop(name, None)


def discover(package: str) -> tuple[PolicySpec[Any, Any], ...]:
    """Imports every `policy_*.py` module of `package`; PolicyDiscoveryError when one fails to
    import or registers no policy. Returns what those modules registered."""
    root = importlib.import_module(package)
    found: list[PolicySpec[Any, Any]] = []
    for info in sorted(pkgutil.iter_modules(root.__path__, prefix=f"{package}."), key=lambda i: i.name):
        if not info.name.rpartition(".")[2].startswith("policy_"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            raise PolicyDiscoveryError(
                f"policy module {info.name} failed to import ({type(exc).__name__}: {exc}); fix it, "
                f"or move it out of {package} if it holds no policy"
            ) from exc
        registered = [spec for spec in _REGISTRY.values() if spec.module == info.name]
        if not registered:
            raise PolicyDiscoveryError(
                f"policy module {info.name} registered no policy; call register_policy(...) in it, or rename "
                f"it: every policy_*.py module of {package} must register one"
            )
        found.extend(registered)
    return tuple(found)


def _load_builtins() -> None:
    global _discovered, _discovering
    if _discovered or _discovering:
        return  # a policy module asking for the registry while it is being imported sees what is there
    _discovering = True
    try:
        discover(BUILTIN_PACKAGE)
        _discovered = True
    finally:
        _discovering = False


def policy_specs(*, builtin_only: bool = False) -> list[PolicySpec[Any, Any]]:
    """Every registered policy (or only the core's own), by name."""
    _load_builtins()
    return [spec for _, spec in sorted(_REGISTRY.items()) if spec.builtin or not builtin_only]


def policy_names(*, builtin_only: bool = False) -> list[str]:
    """Every registered policy name (or only the core's own), sorted."""
    return [spec.name for spec in policy_specs(builtin_only=builtin_only)]


def policy_spec(name: str) -> PolicySpec[Any, Any]:
    """What `name` declared; UnknownPolicyError lists the names that exist."""
    _load_builtins()
    spec = _REGISTRY.get(name)
    if spec is None:
        raise UnknownPolicyError(f"unknown policy {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}")
    return spec


def make_policy(name: str, *, context: PolicyContext) -> Policy:
    """A new policy instance. UnknownPolicyError lists the names that exist; ValueError (parameters)
    and TypeError (options) name the policy, the key, the value and the fix."""
    return policy_spec(name).make(context)
