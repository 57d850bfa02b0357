"""The hook stages: the methods of the RuntimeHooks service (proto/fgpu/v1/hooks.proto), read from its descriptor.

A stage is named by its RPC name (`PreCreateContainer`): hook registrations
list that name, metrics label by it, and the hook client calls
`/fgpu.v1.RuntimeHooks/<name>`. As hooks.proto says, a `Pre*` stage runs
before the CRI call is forwarded and may edit or reject it; a `Post*` stage is
a notification after the call succeeded. Nothing here lists the stages: a new
one is a new rpc in hooks.proto (and a `call_specs.CallSpec` that uses it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from google.protobuf.descriptor import ServiceDescriptor

from apis.fgpu.v1 import hooks_pb2

_RESPONSE = "fgpu.v1.HookResponse"


class _ByConstant(type):
    """`Stage.PRE_CREATE_CONTAINER`: a RuntimeHooks stage by its constant name, as an Enum member is named.

    For code that names one stage (tests, checks of the shipped registration); the proxy's
    own modules take stages from a `Stages` by RPC name.
    """

    def __getattr__(cls, name: str) -> Stage:
        if name.startswith("_") or not name.isupper():
            raise AttributeError(name)
        for stage in RUNTIME_HOOKS.values():
            if constant(stage.name) == name:
                return stage
        raise AttributeError(f"RuntimeHooks has no stage {name}; stages: {sorted(map(constant, RUNTIME_HOOKS))}")


@dataclass(frozen=True)
class Stage(metaclass=_ByConstant):
    """One RuntimeHooks method."""

    #: the RPC name, e.g. "PreCreateContainer"
    name: str
    #: the gRPC method path the hook client calls, e.g. "/fgpu.v1.RuntimeHooks/PreCreateContainer"
    path: str
    #: before the CRI call (may edit or reject it), rather than a notification after it succeeded
    pre: bool

    def __hash__(self) -> int:
        # the path's (str caches it): registries look stages up on every intercepted call
        return hash(self.path)


def constant(name: str) -> str:
    """The constant of an RPC name: PreCreateContainer -> PRE_CREATE_CONTAINER."""
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(name)).upper()


class Stages(Mapping[str, Stage]):
    """The stages of one hooks service, by RPC name, in the order the service declares them."""

    def __init__(self, stages: Iterable[Stage]) -> None:
        self._by_name = {s.name: s for s in stages}

    @classmethod
    def of_service(cls, service: ServiceDescriptor) -> Stages:
        """Every method of `service`; ValueError for one that is neither Pre* nor Post* or answers no HookResponse."""
        stages = []
        for method in service.methods:
            where = f"{service.full_name}/{method.name}"
            if not method.name.startswith(("Pre", "Post")):
                raise ValueError(f"{where}: a hook stage's name starts with Pre (before the call) or Post (after it)")
            if method.output_type.full_name != _RESPONSE:
                raise ValueError(f"{where}: answers {method.output_type.full_name}, not {_RESPONSE}")
            if method.client_streaming or method.server_streaming:
                raise ValueError(f"{where}: a hook stage is a unary call")
            stages.append(Stage(name=method.name, path=f"/{where}", pre=method.name.startswith("Pre")))
        return cls(stages)

    def __getitem__(self, name: str) -> Stage:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"Stages({list(self._by_name)})"


#: the stages of fgpu.v1.RuntimeHooks, the service hook servers implement
RUNTIME_HOOKS = Stages.of_service(hooks_pb2.DESCRIPTOR.services_by_name["RuntimeHooks"])
