"""The intercepted CRI calls: which ones, what the hooks are asked, and what is done with their answers.

CreateContainer is always intercepted (the void default and the GPU
fail-closed rule need no hook to be up). The other calls are intercepted only
while some hook server is registered for their stage, so with no such hook
they cost what any pass-through call costs.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from apis import names
from apis.cri.v1 import runtime_partial_pb2 as cri
from apis.fgpu.v1 import hooks_pb2
from runtimeproxy import crimsg, policy
from runtimeproxy.calls import Forward, Refuse, StreamKind
from runtimeproxy.errors import HookCallError, RuntimeLookupError, grpc_code
from runtimeproxy.hookclient import HookClient
from runtimeproxy.hookconfig import HookRegistry, HookServer, Stage
from runtimeproxy.logs import event
from runtimeproxy.metrics import ProxyMetrics
from runtimeproxy.policy import HookOutcome, OutcomeKind, PodFacts
from runtimeproxy.runtime_client import RuntimeClient

log = logging.getLogger(__name__)


class Method(enum.Enum):
    RUN_POD_SANDBOX = "RunPodSandbox"
    STOP_POD_SANDBOX = "StopPodSandbox"
    REMOVE_POD_SANDBOX = "RemovePodSandbox"
    CREATE_CONTAINER = "CreateContainer"
    START_CONTAINER = "StartContainer"
    STOP_CONTAINER = "StopContainer"
    REMOVE_CONTAINER = "RemoveContainer"
    UPDATE_CONTAINER_RESOURCES = "UpdateContainerResources"

    @property
    def path(self) -> bytes:
        return f"/{names.CRI_RUNTIME_SERVICE}/{self.value}".encode()


_BY_PATH = {m.path: m for m in Method}
#: the stage whose hooks make a method worth intercepting, and how it is intercepted
_STAGE_OF = {
    Method.RUN_POD_SANDBOX: (Stage.PRE_RUN_POD_SANDBOX, StreamKind.EDIT),
    Method.UPDATE_CONTAINER_RESOURCES: (Stage.PRE_UPDATE_CONTAINER_RESOURCES, StreamKind.EDIT),
    Method.START_CONTAINER: (Stage.POST_START_CONTAINER, StreamKind.OBSERVE),
    Method.STOP_CONTAINER: (Stage.POST_STOP_CONTAINER, StreamKind.OBSERVE),
    Method.STOP_POD_SANDBOX: (Stage.POST_STOP_POD_SANDBOX, StreamKind.OBSERVE),
}
_KNOWN_SERVICES = (f"/{names.CRI_RUNTIME_SERVICE}/".encode(), f"/{names.CRI_IMAGE_SERVICE}/".encode())
_INVALID = grpc_code(grpc.StatusCode.INVALID_ARGUMENT)


def method_label(path: bytes) -> str:
    """The metrics label of a call: `RuntimeService/Version`; `unknown` outside the CRI services."""
    for prefix in _KNOWN_SERVICES:
        if path.startswith(prefix):
            return path[1:].decode(errors="replace").removeprefix("runtime.v1.")
    return "unknown"


class HookedCalls:
    """The proxy's CallHandler: classifies calls, runs hooks, applies edits, records metrics."""

    def __init__(
        self,
        *,
        registry: HookRegistry,
        hooks: HookClient,
        runtime: RuntimeClient,
        metrics: ProxyMetrics,
        force_void: bool,
        hook_server_namespaces: tuple[str, ...],
    ) -> None:
        self.registry = registry
        self.hooks = hooks
        self.runtime = runtime
        self.metrics = metrics
        self.force_void = force_void
        self.hook_server_namespaces = hook_server_namespaces
        self._labels: dict[bytes, str] = {}
        self.background: set[asyncio.Task[None]] = set()

    # --- CallHandler --------------------------------------------------------------------------------

    def classify(self, path: bytes) -> StreamKind:
        method = _BY_PATH.get(path)
        if method is None:
            return StreamKind.PASS
        if method is Method.CREATE_CONTAINER:
            return StreamKind.EDIT
        if method in (Method.REMOVE_CONTAINER, Method.REMOVE_POD_SANDBOX):
            return StreamKind.OBSERVE
        stage, kind = _STAGE_OF[method]
        return kind if self.registry.servers(stage) else StreamKind.PASS

    async def edit(self, path: bytes, message: bytes) -> Forward | Refuse:
        method = _BY_PATH[path]
        try:
            if method is Method.CREATE_CONTAINER:
                return await self._create_container(message)
            if method is Method.RUN_POD_SANDBOX:
                return await self._run_pod_sandbox(message)
            if method is Method.UPDATE_CONTAINER_RESOURCES:
                return await self._update_resources(message)
        except DecodeError as exc:
            return self._refuse(
                method, "undecodable", _INVALID, f"fgpu-runtime-proxy: cannot decode {method.value}Request: {exc}"
            )
        return Forward()

    def finished(self, path: bytes, kind: StreamKind, message: bytes | None, code: int, seconds: float) -> None:
        label = self._labels.get(path)
        if label is None:
            label = method_label(path)
            if len(self._labels) < 256:
                self._labels[path] = label
        self.metrics.record_call(label, code, seconds)
        if kind is not StreamKind.OBSERVE or message is None:
            return
        method = _BY_PATH.get(path)
        if method is None:
            return
        try:
            self._observed(method, message, code)
        except DecodeError as exc:
            event(log, logging.WARNING, "undecodable CRI request", method=method.value, error=str(exc))

    # --- Pre stages ---------------------------------------------------------------------------------

    async def _create_container(self, message: bytes) -> Forward | Refuse:
        req = cri.CreateContainerRequest.FromString(message)
        pod = crimsg.pod_facts_from_config(req.sandbox_config)
        ident = _ident(pod, container=req.config.metadata.name, sandbox_id=req.pod_sandbox_id)
        if policy.bypasses_hooks(pod, hook_server_namespaces=self.hook_server_namespaces):
            event(log, logging.INFO, "hook server pod: hooks bypassed", method="CreateContainer", **ident)
            return Forward()
        allocation = policy.has_allocation(pod)
        stage = Stage.PRE_CREATE_CONTAINER
        servers = self.registry.servers(stage)

        def build() -> hooks_pb2.ContainerHookRequest:
            return crimsg.create_request_to_hook(req)

        def apply(edits: Any) -> None:
            crimsg.apply_container_edits(req.config, edits)

        outcomes = await self._call_hooks(stage, servers, build, apply, allocation=allocation)
        judgement = policy.judge(stage, outcomes=outcomes, registered=len(servers), allocation=allocation)
        if judgement.refusal is not None:
            event(log, logging.WARNING, "CreateContainer refused", reason=judgement.refusal, allocation=allocation, **ident)
            return self._refuse(Method.CREATE_CONTAINER, "hooks", judgement.code, judgement.refusal)
        voided = policy.needs_void(judgement.edits, force_void=self.force_void)
        if voided:
            crimsg.force_void(req.config)
            self.metrics.forced_void.inc()
        self._count(judgement.edits)
        event(
            log, logging.INFO, "CreateContainer hooked", allocation=allocation, hooks=len(outcomes),
            void=voided, ignored=";".join(judgement.ignored), **ident,
        )
        if not judgement.edits and not voided:
            return Forward()
        return Forward(req.SerializeToString())

    async def _run_pod_sandbox(self, message: bytes) -> Forward | Refuse:
        req = cri.RunPodSandboxRequest.FromString(message)
        pod = crimsg.pod_facts_from_config(req.config)
        ident = _ident(pod)
        if policy.bypasses_hooks(pod, hook_server_namespaces=self.hook_server_namespaces):
            return Forward()
        stage = Stage.PRE_RUN_POD_SANDBOX
        servers = self.registry.servers(stage)

        def build() -> hooks_pb2.PodSandboxHookRequest:
            return hooks_pb2.PodSandboxHookRequest(
                pod=crimsg.pod_meta_from_config(req.config, runtime_handler=req.runtime_handler),
                resources=crimsg.resources_to_hook(req.config.linux.resources),
            )

        def apply(edits: Any) -> None:
            crimsg.apply_sandbox_edits(req.config, edits)

        return await self._edit_stage(
            Method.RUN_POD_SANDBOX, stage, servers, build, apply,
            allocation=policy.has_allocation(pod), serialize=req.SerializeToString, ident=ident,
        )

    async def _update_resources(self, message: bytes) -> Forward | Refuse:
        req = cri.UpdateContainerResourcesRequest.FromString(message)
        stage = Stage.PRE_UPDATE_CONTAINER_RESOURCES
        try:
            container = await self.runtime.container(req.container_id)
            sandbox = await self.runtime.sandbox(container.pod_sandbox_id)
        except RuntimeLookupError as exc:
            # The runtime will answer this call itself (most likely NotFound): let it.
            event(log, logging.WARNING, "lookup failed; call forwarded unhooked", container_id=req.container_id, error=str(exc))
            return Forward()
        pod = crimsg.pod_facts_from_status(sandbox)
        ident = _ident(pod, container=container.metadata.name, container_id=req.container_id)
        if policy.bypasses_hooks(pod, hook_server_namespaces=self.hook_server_namespaces):
            return Forward()
        pod_meta = crimsg.pod_meta_from_status(sandbox)
        servers = self.registry.servers(stage)

        def build() -> hooks_pb2.ContainerHookRequest:
            return crimsg.container_to_hook(container, pod_meta, resources=req.linux)

        def apply(edits: Any) -> None:
            crimsg.apply_update_edits(req, edits)

        return await self._edit_stage(
            Method.UPDATE_CONTAINER_RESOURCES, stage, servers, build, apply,
            allocation=policy.has_allocation(pod), serialize=req.SerializeToString, ident=ident,
        )

    async def _edit_stage(
        self,
        method: Method,
        stage: Stage,
        servers: tuple[HookServer, ...],
        build: Callable[[], Any],
        apply: Callable[[Any], None],
        *,
        allocation: bool,
        serialize: Callable[[], bytes],
        ident: dict[str, str],
    ) -> Forward | Refuse:
        """Runs a pre stage's hooks and forwards the request as they left it, or refuses it."""
        outcomes = await self._call_hooks(stage, servers, build, apply, allocation=allocation)
        judgement = policy.judge(stage, outcomes=outcomes, registered=len(servers), allocation=allocation)
        if judgement.refusal is not None:
            event(log, logging.WARNING, f"{method.value} refused", reason=judgement.refusal, **ident)
            return self._refuse(method, "hooks", judgement.code, judgement.refusal)
        self._count(judgement.edits)
        event(log, logging.INFO, f"{method.value} hooked", hooks=len(outcomes), **ident)
        return Forward(serialize()) if judgement.edits else Forward()

    async def _call_hooks(
        self,
        stage: Stage,
        servers: tuple[HookServer, ...],
        build: Callable[[], Any],
        apply: Callable[[Any], None],
        *,
        allocation: bool,
    ) -> list[HookOutcome]:
        """Calls `servers` in order; each sees the request as the earlier ones' edits left it."""
        outcomes: list[HookOutcome] = []
        for server in servers:
            outcome = await self._call_one(server, stage, build())
            outcomes.append(outcome)
            if outcome.kind is OutcomeKind.EDITS and stage in policy.PRE_STAGES:
                apply(outcome.edits)
            elif policy.stop_early(stage, outcome, allocation=allocation):
                break
        return outcomes

    async def _call_one(self, server: HookServer, stage: Stage, request: Any) -> HookOutcome:
        try:
            response = await self.hooks.call(server, stage, request)
        except HookCallError as exc:
            return HookOutcome(server=server.name, policy=server.failure_policy, kind=OutcomeKind.FAILED, detail=exc.reason)
        if response.HasField("rejection"):
            return HookOutcome(
                server=server.name, policy=server.failure_policy, kind=OutcomeKind.REJECTED,
                detail=response.rejection.reason,
            )
        return HookOutcome(
            server=server.name, policy=server.failure_policy, kind=OutcomeKind.EDITS,
            edits=crimsg.edits_from_response(response),
        )

    def _refuse(self, method: Method, reason: str, code: int, message: str) -> Refuse:
        self.metrics.refused.labels(method.value, reason).inc()
        return Refuse(code, message)

    def _count(self, edits: tuple[Any, ...]) -> None:
        for e in edits:
            for kind, n in e.counts().items():
                if n:
                    self.metrics.edits.labels(kind).inc(n)

    # --- Post stages --------------------------------------------------------------------------------

    def _observed(self, method: Method, message: bytes, code: int) -> None:
        if method is Method.REMOVE_CONTAINER:
            req_rc = cri.RemoveContainerRequest.FromString(message)
            event(log, logging.INFO, "RemoveContainer", container_id=req_rc.container_id, code=code)
            return
        if method is Method.REMOVE_POD_SANDBOX:
            req_rs = cri.RemovePodSandboxRequest.FromString(message)
            event(log, logging.INFO, "RemovePodSandbox", sandbox_id=req_rs.pod_sandbox_id, code=code)
            return
        if code != 0:
            return
        stage = _STAGE_OF[method][0]
        servers = self.registry.servers(stage)
        if not servers:
            return
        if method is Method.STOP_POD_SANDBOX:
            sandbox_id = cri.StopPodSandboxRequest.FromString(message).pod_sandbox_id
            coro: Coroutine[Any, Any, None] = self._post_sandbox(stage, servers, sandbox_id)
        else:
            request_type = cri.StartContainerRequest if method is Method.START_CONTAINER else cri.StopContainerRequest
            coro = self._post_container(stage, servers, request_type.FromString(message).container_id)
        # Post hooks are notifications: kubelet already has its answer, they run beside it.
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _post_container(self, stage: Stage, servers: tuple[HookServer, ...], container_id: str) -> None:
        try:
            container = await self.runtime.container(container_id)
            sandbox = await self.runtime.sandbox(container.pod_sandbox_id)
        except RuntimeLookupError as exc:
            event(log, logging.WARNING, "post hook skipped: lookup failed", stage=stage.value, container_id=container_id, error=str(exc))
            return
        pod = crimsg.pod_facts_from_status(sandbox)
        if policy.bypasses_hooks(pod, hook_server_namespaces=self.hook_server_namespaces):
            return
        request = crimsg.container_to_hook(container, crimsg.pod_meta_from_status(sandbox))
        await self._post(stage, servers, request, _ident(pod, container=container.metadata.name, container_id=container_id))

    async def _post_sandbox(self, stage: Stage, servers: tuple[HookServer, ...], sandbox_id: str) -> None:
        try:
            sandbox = await self.runtime.sandbox(sandbox_id)
        except RuntimeLookupError as exc:
            event(log, logging.WARNING, "post hook skipped: lookup failed", stage=stage.value, sandbox_id=sandbox_id, error=str(exc))
            return
        pod = crimsg.pod_facts_from_status(sandbox)
        if policy.bypasses_hooks(pod, hook_server_namespaces=self.hook_server_namespaces):
            return
        request = hooks_pb2.PodSandboxHookRequest(pod=crimsg.pod_meta_from_status(sandbox))
        await self._post(stage, servers, request, _ident(pod, sandbox_id=sandbox_id))

    async def _post(self, stage: Stage, servers: tuple[HookServer, ...], request: Any, ident: dict[str, str]) -> None:
        outcomes = [await self._call_one(server, stage, request) for server in servers]
        judgement = policy.judge(stage, outcomes=outcomes, registered=len(servers), allocation=False)
        event(log, logging.INFO, f"{stage.value} notified", hooks=len(outcomes), problems=";".join(judgement.ignored), **ident)


def _ident(pod: PodFacts, **more: str) -> dict[str, str]:
    return {"pod": pod.ref, "pod_uid": pod.uid, **{k: v for k, v in more.items() if v}}

