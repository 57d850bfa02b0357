"""The proxy's CallHandler: runs the hooks of the intercepted CRI calls, as their specs (`cri_calls`) say.

Which calls, and how each finds its pod, asks its hooks and takes their
answers, is in the specs; this module does the same for every one of them:

- Pre* stage (`StreamKind.EDIT`): find the pod, call the stage's hook servers
  in order, each seeing the request as the earlier ones' edits left it, judge
  their outcomes (`verdicts`), then forward the request as edited or refuse
  the call. A call with a `gpu_container` also gets the void default.
- Post* stage (`StreamKind.OBSERVE`): once the call succeeded, find the pod and
  notify the stage's hook servers beside the call (kubelet has its answer).
- No stage: log the call.

A call is intercepted only while some hook server is registered for its stage
(unless its spec says always), so with no such hook it costs what any
pass-through call costs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from apis import container_edits, names
from apis.container_edits import ContainerEdits, EditsError
from runtimeproxy import cri_calls, crimsg, edits, verdicts
from runtimeproxy.call_specs import CallSpec, CallSpecs, Runtime, Subject
from runtimeproxy.calls import Forward, Refuse, StreamKind
from runtimeproxy.errors import HookCallError, RuntimeLookupError, grpc_code
from runtimeproxy.hookclient import HookClient
from runtimeproxy.hookconfig import FailurePolicy, HookRegistry, HookServer
from runtimeproxy.logs import event
from runtimeproxy.metrics import ProxyMetrics
from runtimeproxy.stages import Stage
from runtimeproxy.verdicts import HookOutcome, OutcomeKind

log = logging.getLogger(__name__)

_KNOWN_SERVICES = (f"/{names.CRI_RUNTIME_SERVICE}/".encode(), f"/{names.CRI_IMAGE_SERVICE}/".encode())
_INVALID = grpc_code(grpc.StatusCode.INVALID_ARGUMENT)


def method_label(path: bytes) -> str:
    """The metrics label of a call: `RuntimeService/Version`; `unknown` outside the CRI services."""
    for prefix in _KNOWN_SERVICES:
        if path.startswith(prefix):
            return path[1:].decode(errors="replace").removeprefix("runtime.v1.")
    return "unknown"


class HookedCalls:
    """The proxy's CallHandler: classifies calls, runs hooks, applies edits, records metrics.

    `specs` are the intercepted calls (the proxy's own by default); the hook
    registry's stages must be theirs.
    """

    def __init__(
        self,
        *,
        registry: HookRegistry,
        hooks: HookClient,
        runtime: Runtime,
        metrics: ProxyMetrics,
        force_void: bool,
        hook_server_namespaces: tuple[str, ...],
        specs: CallSpecs = cri_calls.SPECS,
    ) -> None:
        self.registry = registry
        self.hooks = hooks
        self.runtime = runtime
        self.metrics = metrics
        self.force_void = force_void
        self.hook_server_namespaces = hook_server_namespaces
        self.specs = specs
        self._by_path = specs.by_path
        self._labels: dict[bytes, str] = {}
        self._record = metrics.calls.record
        self.background: set[asyncio.Task[None]] = set()

    # --- CallHandler --------------------------------------------------------------------------------

    def classify(self, path: bytes) -> StreamKind:
        spec = self._by_path.get(path)
        if spec is None:
            return StreamKind.PASS
        if spec.always or self.registry.servers(spec.stage):
            return spec.kind
        return StreamKind.PASS

    async def edit(self, path: bytes, message: bytes) -> Forward | Refuse:
        spec = self._by_path[path]
        try:
            return await self._pre(spec, spec.request_type.FromString(message))
        except DecodeError as exc:
            name = spec.request_type.DESCRIPTOR.name
            return self._refuse(spec, "undecodable", _INVALID, f"fgpu-runtime-proxy: cannot decode {name}: {exc}")

    def finished(self, path: bytes, kind: StreamKind, message: bytes | None, code: int, seconds: float) -> None:
        label = self._labels.get(path)
        if label is None:
            label = method_label(path)
            if len(self._labels) < 256:
                self._labels[path] = label
        self._record(label, code, seconds)
        if kind is not StreamKind.OBSERVE or message is None:
            return
        spec = self._by_path.get(path)
        if spec is None:
            return
        try:
            self._observed(spec, message, code)
        except DecodeError as exc:
            event(log, logging.WARNING, "undecodable CRI request", method=spec.method, error=str(exc))

    # --- Pre stages ---------------------------------------------------------------------------------

    async def _pre(self, spec: CallSpec[Any], req: Message) -> Forward | Refuse:
        """Runs a Pre* stage's hooks and forwards the request as they left it, or refuses the call."""
        assert spec.stage is not None and spec.build is not None and spec.apply is not None
        stage, build, apply = spec.stage, spec.build, spec.apply
        gpu = spec.gpu_container
        try:
            subject = await spec.pod.find(req, self.runtime)
        except RuntimeLookupError as exc:
            required = [s.name for s in self.registry.servers(stage) if s.failure_policy is FailurePolicy.FAIL]
            if exc.not_found or not required:
                # No such object: the runtime fails this call the same way itself. Or no hook must run.
                event(log, logging.WARNING, "lookup failed; call forwarded unhooked", **spec.pod.ids(req),
                      error=str(exc))
                return Forward()
            # A hook that must run cannot be given the call's pod: forwarding unhooked would skip it.
            reason = (f"the runtime could not be asked which pod this call is for ({exc}), so hook "
                      f"{', '.join(required)} (failurePolicy Fail) could not run; retry when the runtime answers")
            event(log, logging.WARNING, f"{spec.method} refused", reason=reason, **spec.pod.ids(req))
            return self._refuse(spec, "runtime_lookup", grpc_code(grpc.StatusCode.UNAVAILABLE), reason)
        ident = subject.log_fields()
        if verdicts.bypasses_hooks(subject.pod, hook_server_namespaces=self.hook_server_namespaces):
            if gpu is not None:
                event(log, logging.INFO, "hook server pod: hooks bypassed", method=spec.method, **ident)
            return Forward()
        allocation = verdicts.has_allocation(subject.pod)
        # GPU containers' lines say whether the pod has an allocation, and what the void default did
        shown: dict[str, Any] = {"allocation": allocation} if gpu is not None else {}
        servers = self.registry.servers(stage)
        outcomes = await self._call_hooks(
            stage, servers, lambda: build(req, subject), lambda answer: apply(req, answer), allocation=allocation
        )
        judgement = verdicts.judge(stage, outcomes=outcomes, registered=len(servers), allocation=allocation)
        if judgement.refusal is not None:
            event(log, logging.WARNING, f"{spec.method} refused", reason=judgement.refusal, **shown, **ident)
            return self._refuse(spec, "hooks", judgement.code, judgement.refusal)
        voided = False
        if gpu is not None:
            voided = verdicts.needs_void(judgement.edits, force_void=self.force_void)
            if voided:
                crimsg.force_void(gpu(req))
                self.metrics.forced_void.inc()
            shown.update(hooks=len(outcomes), void=voided, ignored=";".join(judgement.ignored))
        else:
            shown.update(hooks=len(outcomes))
        self._count(judgement.edits)
        event(log, logging.INFO, f"{spec.method} hooked", **shown, **ident)
        if not judgement.edits and not voided:
            return Forward()
        return Forward(req.SerializeToString())

    async def _call_hooks(
        self,
        stage: Stage,
        servers: tuple[HookServer, ...],
        build: Callable[[], Message],
        apply: Callable[[ContainerEdits], None],
        *,
        allocation: bool,
    ) -> list[HookOutcome]:
        """Calls `servers` in order; each sees the request as the earlier ones' edits left it."""
        outcomes: list[HookOutcome] = []
        for server in servers:
            outcome = await self._call_one(server, stage, build())
            outcomes.append(outcome)
            if outcome.kind is OutcomeKind.EDITS and stage.pre:
                apply(outcome.edits)
            elif verdicts.stop_early(stage, outcome, allocation=allocation):
                break
        return outcomes

    async def _call_one(self, server: HookServer, stage: Stage, request: Message) -> HookOutcome:
        try:
            response = await self.hooks.call(server, stage, request)
        except HookCallError as exc:
            return HookOutcome(server=server.name, policy=server.failure_policy, kind=OutcomeKind.FAILED, detail=exc.reason)
        if response.HasField("rejection"):
            return HookOutcome(
                server=server.name, policy=server.failure_policy, kind=OutcomeKind.REJECTED,
                detail=response.rejection.reason,
            )
        try:
            answered = container_edits.from_proto(response)
        except EditsError as exc:  # the hook's failure policy decides, as for a call that failed
            return HookOutcome(
                server=server.name, policy=server.failure_policy, kind=OutcomeKind.FAILED, detail=f"bad answer: {exc}"
            )
        return HookOutcome(server=server.name, policy=server.failure_policy, kind=OutcomeKind.EDITS, edits=answered)

    def _refuse(self, spec: CallSpec[Any], reason: str, code: int, message: str) -> Refuse:
        self.metrics.refused.labels(spec.method, reason).inc()
        return Refuse(code, message)

    def _count(self, answers: tuple[ContainerEdits, ...]) -> None:
        for e in answers:
            for kind, n in edits.counts(e).items():
                if n:
                    self.metrics.edits.labels(kind).inc(n)

    # --- Post stages and logged calls ---------------------------------------------------------------

    def _observed(self, spec: CallSpec[Any], message: bytes, code: int) -> None:
        if spec.stage is None:
            event(log, logging.INFO, spec.method, **spec.pod.ids(spec.request_type.FromString(message)), code=code)
            return
        if code != 0:
            return
        servers = self.registry.servers(spec.stage)
        if not servers:
            return
        coro = self._notify(spec, spec.stage, servers, spec.request_type.FromString(message))
        # Post hooks are notifications: kubelet already has its answer, they run beside it.
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _notify(self, spec: CallSpec[Any], stage: Stage, servers: tuple[HookServer, ...], req: Message) -> None:
        assert spec.build is not None
        try:
            subject = await spec.pod.find(req, self.runtime)
        except RuntimeLookupError as exc:
            event(log, logging.WARNING, "post hook skipped: lookup failed", stage=stage.name, **spec.pod.ids(req),
                  error=str(exc))
            return
        if verdicts.bypasses_hooks(subject.pod, hook_server_namespaces=self.hook_server_namespaces):
            return
        await self._post(stage, servers, spec.build(req, subject), subject)

    async def _post(self, stage: Stage, servers: tuple[HookServer, ...], request: Message, subject: Subject) -> None:
        outcomes = [await self._call_one(server, stage, request) for server in servers]
        judgement = verdicts.judge(stage, outcomes=outcomes, registered=len(servers), allocation=False)
        event(log, logging.INFO, f"{stage.name} notified", hooks=len(outcomes), problems=";".join(judgement.ignored),
              **subject.log_fields())
