"""What the proxy must know to hook one CRI method (a `CallSpec`), and a checked set of them (`CallSpecs`).

A spec says, for one CRI method:

- `method`, `request_type`: the method's name and its request message (the
  partial schema, proto/cri/v1/runtime_partial.proto); `path` follows;
- `stage`: the RuntimeHooks stage its hooks answer (`runtimeproxy.stages`), or
  None for a call that is only logged;
- `kind` follows from the stage: a Pre* stage holds the request for its hooks
  and forwards it as they left it (`EDIT`); a Post* stage forwards it and
  notifies the hooks once the call succeeded (`OBSERVE`);
- `pod`: how to find the pod: `InRequest` (the request carries the sandbox
  config), `ByContainerId` or `BySandboxId` (the runtime is asked; the proxy
  keeps no state);
- `build`: the hook request, from the CRI request as earlier hooks' edits left
  it and what `pod` found;
- `apply`: one hook's answer applied to the CRI request (Pre* stages);
- `gpu_container`: for a call that creates a container, its config: it gets
  `NVIDIA_VISIBLE_DEVICES=void` unless a hook set the variable.

A call is intercepted while some hook server is registered for its stage;
one with a `gpu_container`, or without a stage, always (the void default and
the GPU fail-closed rule need no hook to be up).

The proxy's own specs are in `cri_calls`; `build` and `apply` are a codec pair
in `crimsg`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from google.protobuf.message import Message

from apis import names
from apis.container_edits import ContainerEdits
from apis.cri.v1 import runtime_partial_pb2 as cri
from runtimeproxy import crimsg
from runtimeproxy.calls import StreamKind
from runtimeproxy.stages import RUNTIME_HOOKS, Stage, Stages
from runtimeproxy.verdicts import PodFacts

R = TypeVar("R", bound=Message)
R_contra = TypeVar("R_contra", bound=Message, contravariant=True)


class Runtime(Protocol):
    """What a spec may ask the runtime (`runtime_client.RuntimeClient`); RuntimeLookupError when it cannot tell."""

    async def container(self, container_id: str) -> cri.Container: ...

    async def sandbox(self, sandbox_id: str) -> cri.PodSandboxStatus: ...


@dataclass(frozen=True)
class Subject:
    """The pod a call is about, and for a call that names a container or sandbox by ID what the runtime said of it."""

    pod: PodFacts
    #: log fields beside the pod: container, sandbox_id, container_id (empty ones are left out)
    ident: Mapping[str, str] = field(default_factory=dict)
    sandbox: cri.PodSandboxStatus | None = None
    container: cri.Container | None = None

    def log_fields(self) -> dict[str, str]:
        return {"pod": self.pod.ref, "pod_uid": self.pod.uid, **{k: v for k, v in self.ident.items() if v}}

    def runtime_sandbox(self) -> cri.PodSandboxStatus:
        if self.sandbox is None:
            raise TypeError("this call's pod came from its request; the runtime was not asked (use ByContainerId)")
        return self.sandbox

    def runtime_container(self) -> cri.Container:
        if self.container is None:
            raise TypeError("this call names no container the runtime was asked about (use ByContainerId)")
        return self.container


class PodFinder(Protocol[R_contra]):
    """How a spec finds the pod of a request."""

    def ids(self, request: R_contra) -> dict[str, str]:
        """The IDs the request names, for log lines (also when the pod cannot be found)."""
        ...

    async def find(self, request: R_contra, runtime: Runtime) -> Subject:
        """The call's subject; RuntimeLookupError when the runtime cannot tell."""
        ...


@dataclass(frozen=True)
class InRequest(Generic[R]):
    """The request carries the pod's sandbox config (RunPodSandbox, CreateContainer)."""

    config: Callable[[R], cri.PodSandboxConfig]
    #: log fields the request names: container, sandbox_id
    ident: Callable[[R], dict[str, str]] = lambda _: {}

    def ids(self, request: R) -> dict[str, str]:
        return self.ident(request)

    async def find(self, request: R, runtime: Runtime) -> Subject:
        return Subject(pod=crimsg.pod_facts_from_config(self.config(request)), ident=self.ident(request))


@dataclass(frozen=True)
class ByContainerId(Generic[R]):
    """The request names a container: the runtime tells its pod (ListContainers, PodSandboxStatus)."""

    container_id: Callable[[R], str]

    def ids(self, request: R) -> dict[str, str]:
        return {"container_id": self.container_id(request)}

    async def find(self, request: R, runtime: Runtime) -> Subject:
        container_id = self.container_id(request)
        container = await runtime.container(container_id)
        sandbox = await runtime.sandbox(container.pod_sandbox_id)
        return Subject(
            pod=crimsg.pod_facts_from_status(sandbox),
            ident={"container": container.metadata.name, "container_id": container.id},
            sandbox=sandbox, container=container,
        )


@dataclass(frozen=True)
class BySandboxId(Generic[R]):
    """The request names a pod sandbox: the runtime tells the pod (PodSandboxStatus)."""

    sandbox_id: Callable[[R], str]

    def ids(self, request: R) -> dict[str, str]:
        return {"sandbox_id": self.sandbox_id(request)}

    async def find(self, request: R, runtime: Runtime) -> Subject:
        sandbox_id = self.sandbox_id(request)
        sandbox = await runtime.sandbox(sandbox_id)
        return Subject(pod=crimsg.pod_facts_from_status(sandbox), ident={"sandbox_id": sandbox_id}, sandbox=sandbox)


@dataclass(frozen=True, kw_only=True)
class CallSpec(Generic[R]):
    """One intercepted CRI method (see the module docstring)."""

    method: str
    request_type: type[R]
    stage: Stage | None
    pod: PodFinder[R]
    build: Callable[[R, Subject], Message] | None = None
    apply: Callable[[R, ContainerEdits], None] | None = None
    gpu_container: Callable[[R], cri.ContainerConfig] | None = None
    service: str = names.CRI_RUNTIME_SERVICE

    @property
    def path(self) -> bytes:
        return f"/{self.service}/{self.method}".encode()

    @property
    def kind(self) -> StreamKind:
        return StreamKind.EDIT if self.stage is not None and self.stage.pre else StreamKind.OBSERVE

    @property
    def always(self) -> bool:
        """Intercepted even while no hook server is registered for the stage."""
        return self.stage is None or self.gpu_container is not None

    def problems(self, stages: Stages) -> list[str]:
        """What is inconsistent in this spec, for the stages hook servers implement."""
        out = []
        stage = self.stage
        if stage is not None and stages.get(stage.name) != stage:
            out.append(f"stage {stage.name} is not one of {list(stages)}")
        if stage is not None and self.build is None:
            out.append("a hooked call needs `build` (its hook request)")
        if stage is not None and stage.pre and self.apply is None:
            out.append(f"{stage.name} is a Pre* stage: it needs `apply` (a hook's answer to the request)")
        if (stage is None or not stage.pre) and (self.apply is not None or self.gpu_container is not None):
            out.append("only a Pre* stage applies hooks' answers (`apply`, `gpu_container`): Post* ones are notifications")
        if stage is None and self.build is not None:
            out.append("a call without a stage is only logged: it has no `build`")
        return out


class CallSpecs:
    """The intercepted CRI methods by path; ValueError on a spec that does not fit `stages` or a path given twice."""

    def __init__(self, specs: Iterable[CallSpec[Any]], *, stages: Stages = RUNTIME_HOOKS) -> None:
        self.stages = stages
        self.by_path: dict[bytes, CallSpec[Any]] = {}
        for spec in specs:
            problems = spec.problems(stages)
            if spec.path in self.by_path:
                problems.append("another spec intercepts this method already")
            if problems:
                raise ValueError(f"CallSpec {spec.path.decode()}: " + "; ".join(problems))
            self.by_path[spec.path] = spec

    def __iter__(self) -> Iterator[CallSpec[Any]]:
        return iter(self.by_path.values())

    def __len__(self) -> int:
        return len(self.by_path)
