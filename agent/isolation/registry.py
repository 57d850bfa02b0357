"""The isolation backends: what one declares when it registers, and the registry that finds them.

A backend is one module of this package that calls `register_backend` when imported (see
the package docstring for the recipe). It declares its name (what `isolation:` in the
agent's config, `--isolation` and `FGPU_ISOLATION` say), its host and container paths
(`PathKey`: a key of the config's `isolationPaths` with its default), the variables its
library reads (removed from the pod's own env), and four functions:

- `edits`: what a container with limited shares gets under it (`edits.BackendEdits`: the
  protocol's `apis.container_edits.ContainerEdits` (env, mounts, devices, CDI devices,
  annotations, cgroup resources) and the host directories to make);
- `check`: whether it can enforce a share on this node now (`readiness.BackendStatus`);
- `on_pod_stopped`: clean up what `edits` left on the host for a pod that stopped;
- `remove_leftovers`: the same for pods that went away while the agent was down.

The registry imports every module of this package on first use, except the helpers listed in
`HELPER_MODULES`; a module that fails to import or registers nothing is an error, not a
silent drop. Nothing else lists the backends: the config, the CLI's choices, the backend
check, the hook server's cleanup and the local stack all read `backends()`.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Protocol

from agent.isolation.edits import BackendEdits, VisibleGPU
from agent.isolation.readiness import BackendStatus, Files, Machine

#: The package whose modules are the backends.
PACKAGE: Final = "agent.isolation"
#: Modules of the package that hold no backend.
HELPER_MODULES: Final = frozenset({"burst", "container", "edits", "hami_cache", "readiness", "registry"})


class UnknownBackendError(ValueError):
    """An isolation backend name nobody registered."""


class BackendDiscoveryError(ImportError):
    """A backend module failed to import or registered no backend."""


@dataclass(frozen=True)
class PathKey:
    """A path a backend uses, settable under `isolationPaths` in the agent's config."""

    #: the config key, camelCase: "hamiLibrary"
    key: str
    default: str
    #: what it is, one line for the docs
    doc: str
    #: False for a path inside the container (nothing to make on the host)
    on_host: bool = True
    #: a file (True) or a directory on the host; the local stack makes stand-ins of each
    is_file: bool = False

    @property
    def attr(self) -> str:
        """The Python spelling: `hamiLibrary` -> `hami_library`."""
        return re.sub(r"(?<!^)(?=[A-Z])", "_", self.key).lower()


class IsolationPaths:
    """Every backend's paths: the config's `isolationPaths`, defaults for the keys not given.

    Read as `paths[KEY]` with the backend's `PathKey`, or as `paths.hami_library`; built from
    keyword arguments in the Python spelling (`IsolationPaths(hami_library="/x")`) or from
    config keys (`IsolationPaths.from_keys({"hamiLibrary": "/x"})`). Frozen.
    """

    __slots__ = ("_given",)
    _given: Mapping[str, str]

    def __init__(self, **given: str) -> None:
        keys: dict[str, str] = {}
        for attr, value in given.items():
            try:
                keys[_path_key(attr=attr).key] = value
            except KeyError:
                raise TypeError(f"IsolationPaths() got an unexpected keyword argument {attr!r}") from None
        object.__setattr__(self, "_given", MappingProxyType(keys))

    @classmethod
    def from_keys(cls, values: Mapping[str, str]) -> IsolationPaths:
        """KeyError naming the key when one is not any backend's."""
        return cls(**{_path_key(key=key).attr: value for key, value in values.items()})

    def __getitem__(self, key: PathKey) -> str:
        return self._given.get(key.key, key.default)

    def __getattr__(self, attr: str) -> str:
        if attr.startswith("_"):
            raise AttributeError(attr)
        try:
            return self[_path_key(attr=attr)]
        except KeyError:
            raise AttributeError(f"no isolation backend declares a path {attr!r}") from None

    def __setattr__(self, attr: str, value: object) -> None:
        raise AttributeError(f"IsolationPaths is frozen; build another with {attr}=...")

    def as_keys(self) -> dict[str, str]:
        """Every declared key with its value, as the config spells them."""
        return {k.key: self[k] for k in path_keys()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IsolationPaths) and self.as_keys() == other.as_keys()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.as_keys().items())))

    def __repr__(self) -> str:
        return f"IsolationPaths({dict(self._given)!r})"


class EditsFn(Protocol):
    def __call__(
        self, gpus: Sequence[VisibleGPU], *, paths: IsolationPaths, pod_uid: str, container_name: str
    ) -> BackendEdits:
        """The backend's own edits for a container with at least one limited share on `gpus`, in
        CUDA ordinal order. Visibility and the FGPU_* variables are added by `container.edits_for`."""
        ...


class CheckFn(Protocol):
    def __call__(self, paths: IsolationPaths, *, files: Files, machine: Machine) -> BackendStatus: ...


class PodStoppedFn(Protocol):
    def __call__(self, paths: IsolationPaths, *, pod_uid: str) -> None: ...


class LeftoversFn(Protocol):
    def __call__(self, paths: IsolationPaths, *, live_uids: Collection[str], min_age_s: float) -> list[str]:
        """Removes what pods not in `live_uids` left (older than `min_age_s`); returns what it removed."""
        ...


def _nothing_to_clean(paths: IsolationPaths, *, pod_uid: str) -> None:
    return None


def _no_leftovers(paths: IsolationPaths, *, live_uids: Collection[str], min_age_s: float) -> list[str]:
    return []


@dataclass(frozen=True)
class Backend:
    """What a backend declares when it registers: everything the rest of the agent knows of it."""

    name: str
    #: one line for `--help` and the docs
    summary: str
    edits: EditsFn
    check: CheckFn
    on_pod_stopped: PodStoppedFn
    remove_leftovers: LeftoversFn
    path_keys: tuple[PathKey, ...]
    #: variables its library reads, by name and by prefix: the pod's own are removed
    env_names: tuple[str, ...]
    env_prefixes: tuple[str, ...]
    #: False for visibility only: then a node's backend problem never rejects a share, and
    #: CUDA_VISIBLE_DEVICES is left to the image
    enforces_limits: bool
    #: the module that registered it
    module: str

    @property
    def builtin(self) -> bool:
        return self.module.startswith(f"{PACKAGE}.")

    def reads(self, env_name: str) -> bool:
        return env_name in self.env_names or env_name.startswith(self.env_prefixes)


_REGISTRY: dict[str, Backend] = {}
_discovered = False
_discovering = False


def register_backend(
    name: str,
    *,
    summary: str,
    edits: EditsFn,
    check: CheckFn,
    on_pod_stopped: PodStoppedFn = _nothing_to_clean,
    remove_leftovers: LeftoversFn = _no_leftovers,
    path_keys: Sequence[PathKey] = (),
    env_names: Sequence[str] = (),
    env_prefixes: Sequence[str] = (),
    enforces_limits: bool = True,
    replace: bool = False,
) -> Backend:
    """Makes `name` an isolation backend. A name or a path key taken by another module needs
    `replace=True` (the same module may register again, as when it is reloaded)."""
    if not name or name != name.strip() or name != name.lower():
        raise ValueError(f"isolation backend name {name!r} must be a lower-case word such as 'hami-core'")
    module = str(sys._getframe(1).f_globals.get("__name__", ""))
    backend = Backend(
        name=name, summary=summary, edits=edits, check=check, on_pod_stopped=on_pod_stopped,
        remove_leftovers=remove_leftovers, path_keys=tuple(path_keys), env_names=tuple(env_names),
        env_prefixes=tuple(env_prefixes), enforces_limits=enforces_limits, module=module,
    )
    existing = _REGISTRY.get(name)
    if existing is not None and not replace and existing.module != module:
        raise ValueError(f"isolation backend {name!r} is already registered; pass replace=True to override it")
    for other in _REGISTRY.values():
        if other.name == name or other.module == module:
            continue
        clash = {k.key for k in other.path_keys} & {k.key for k in backend.path_keys}
        if clash:
            raise ValueError(f"isolation backend {name!r}: path key(s) {sorted(clash)} already belong to backend {other.name!r}")
    _REGISTRY[name] = backend
    return backend


def unregister_backend(name: str) -> None:
    """Forgets a backend (a test's or a plug-in's); unknown names are fine."""
    _REGISTRY.pop(name, None)


def discover(package: str = PACKAGE) -> tuple[Backend, ...]:
    """Imports every module of `package` but its helpers; BackendDiscoveryError when one fails to
    import or registers no backend. Returns what those modules registered."""
    root = importlib.import_module(package)
    found: list[Backend] = []
    for info in sorted(pkgutil.iter_modules(root.__path__, prefix=f"{package}."), key=lambda i: i.name):
        if info.name.rpartition(".")[2] in HELPER_MODULES:
            continue
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            raise BackendDiscoveryError(
                f"isolation backend module {info.name} failed to import ({type(exc).__name__}: {exc}); fix it"
            ) from exc
        registered = [b for b in _REGISTRY.values() if b.module == info.name]
        if not registered:
            raise BackendDiscoveryError(
                f"isolation module {info.name} registered no backend; call register_backend(...) in it, "
                f"or add it to HELPER_MODULES in {__name__} if it is a helper"
            )
        found.extend(registered)
    return tuple(found)


def _load_builtins() -> None:
    global _discovered, _discovering
    if _discovered or _discovering:
        return
    _discovering = True
    try:
        discover()
        _discovered = True
    finally:
        _discovering = False


def backends() -> list[Backend]:
    """Every registered backend, by name."""
    _load_builtins()
    return [b for _, b in sorted(_REGISTRY.items())]


def backend_names() -> list[str]:
    return [b.name for b in backends()]


def backend(name: str) -> Backend:
    """UnknownBackendError lists the names that exist."""
    _load_builtins()
    found = _REGISTRY.get(name)
    if found is None:
        raise UnknownBackendError(f"unknown isolation backend {name!r}; use one of {', '.join(sorted(_REGISTRY))}")
    return found


def parse_name(value: str, *, field: str = "isolation") -> str:
    """`value` when it names a backend; ValueError naming the field, the value and the choices."""
    if value not in backend_names():
        raise ValueError(f"{field}={value!r} is not an isolation backend; use one of {', '.join(backend_names())}")
    return value


def path_keys() -> list[PathKey]:
    """Every backend's path keys, in backend then declaration order."""
    return [k for b in backends() for k in b.path_keys]


def _path_key(*, key: str = "", attr: str = "") -> PathKey:
    for k in path_keys():
        if (key and k.key == key) or (attr and k.attr == attr):
            return k
    raise KeyError(key or attr)


def iter_env_readers(env_name: str) -> Iterator[Backend]:
    """The backends whose library reads `env_name`."""
    return (b for b in backends() if b.reads(env_name))
