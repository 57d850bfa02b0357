"""The RuntimeHooks gRPC server: the runtime proxy's view of the GPU hook.

Thin: a request becomes a `agent.hook.HookRequest`, `agent.hook.decide`
answers, and the decision becomes a `HookResponse`. A pod whose allocation
asks for a MIG instance to be created has it made between two decisions
(`agent.mig_lifecycle`): the first claims the placement in the admission ledger
under its lock, the create runs without it (a create takes long; admissions on
other GPUs go on meanwhile, and one for the same placement sees the claim and is
refused), and the second confirms the claim or rolls it back, under the lock again.
The instances of a stopped pod are destroyed at PostStopPodSandbox, also outside
the ledger's lock. It listens on a unix
socket with health and reflection, like every fgpu server. Unexpected
errors in the decision are reported as gRPC INTERNAL (the proxy's failure
policy decides what that means for the container); the server never dies of
a request.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc

from agent.admissions import AdmissionLedger, GPUHeld, Hold
from agent.hook import NO_ANSWER, HookDecision, HookRequest, HookSettings, decide
from agent.isolation import registry
from agent.metrics import AgentMetrics
from agent.mig_lifecycle import MIGLifecycle
from agent.mig_manager import Want
from apis import container_edits, names
from apis.allocation import lists_gpus
from apis.devices import NodeDevices
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from apis.grpc_server import CHANNEL_OPTIONS, Address, add_health_and_reflection, add_listener
from apis.signing import SigningKeyError

log = logging.getLogger(__name__)

SERVICE_NAME = hooks_pb2.DESCRIPTOR.services_by_name["RuntimeHooks"].full_name


@dataclass(frozen=True)
class _Claim:
    """A pod's MIG placements claimed in the ledger while their instances are made."""

    #: The pod's ledger entry before the claim (an earlier container's), None when it had none.
    before: tuple[Hold, ...] | None
    holds: tuple[Hold, ...]


class GPUHookServicer(hooks_pb2_grpc.RuntimeHooksServicer):
    def __init__(
        self,
        *,
        devices: Callable[[], NodeDevices],
        settings: Callable[[], HookSettings],
        metrics: AgentMetrics | None = None,
        ledger: AdmissionLedger | None = None,
        mig: MIGLifecycle | None = None,
    ) -> None:
        """`settings` is called per request; it raises SigningKeyError while the key cannot be read.

        `mig`: creates and destroys MIG instances for allocations that ask for them; None: such
        an allocation is rejected (this agent cannot create MIG instances)."""
        self._devices = devices
        self._settings = settings
        self._metrics = metrics or AgentMetrics()
        self.ledger = ledger or AdmissionLedger()
        self._mig = mig

    def PreCreateContainer(
        self, request: hooks_pb2.ContainerHookRequest, context: grpc.ServicerContext
    ) -> hooks_pb2.HookResponse:
        pod = request.pod
        hook_request = HookRequest(
            pod_uid=pod.uid,
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            container_name=request.container.name,
            annotations=dict(pod.annotations),
            env_names=tuple(kv.key for kv in request.envs),
            sandbox_id=pod.sandbox_id,
        )
        try:
            try:
                settings = self._settings()
            except SigningKeyError as err:
                if not lists_gpus(hook_request.annotations.get(names.DEVICE_ALLOCATED)):
                    return self._response(NO_ANSWER)
                return self._response(HookDecision(rejection=f"fgpu agent cannot verify GPU allocations: {err}"))
            devices = self._devices()
            # Check and record under one lock: two pods racing for the last share of a GPU
            # must not both see it free.
            with self.ledger.lock:
                held = self.ledger.held(excluding=hook_request.pod_uid)
                decision = self._not_gone(decide(hook_request, devices=devices, settings=settings, held=held), hook_request)
                claim: _Claim | None = None
                if decision.mig_needed and self._mig is None:
                    decision = self._without_mig(decision, hook_request, devices=devices, settings=settings, held=held)
                elif decision.mig_needed:
                    claim = _Claim(before=self.ledger.pods().get(hook_request.pod_uid), holds=decision.holds)
                    self.ledger.record(pod_uid=hook_request.pod_uid, holds=claim.holds, sandbox_id=pod.sandbox_id)
                if claim is None:
                    response = self._response(decision)
                    admitted = decision.edits is not None and not response.HasField("rejection")
                    if admitted:
                        self.ledger.record(pod_uid=hook_request.pod_uid, holds=decision.holds, sandbox_id=pod.sandbox_id)
                    self._metrics.admitted_pods.set(len(self.ledger.pods()))
            if claim is not None:
                decision, response, admitted = self._with_mig(
                    decision, claim, hook_request, devices=devices, settings=settings
                )
            # logged outside the lock: a slow stderr must not hold up the next container's decision
            if admitted and decision.edits is not None and log.isEnabledFor(logging.INFO):
                env = dict(decision.edits.envs)
                log.info(
                    "pod %s/%s container %s: GPUs %s, isolation %s", pod.namespace, pod.name,
                    hook_request.container_name,
                    env.get(names.NVIDIA_VISIBLE_DEVICES, ""), env.get(names.FGPU_ISOLATION, ""),
                )
        except Exception as err:  # a bug must not take the hook server down
            log.exception("PreCreateContainer for pod %s/%s failed", pod.namespace, pod.name)
            context.abort(grpc.StatusCode.INTERNAL, f"fgpu agent: internal error deciding GPU edits: {err}")
        return response

    def PostStopPodSandbox(
        self, request: hooks_pb2.PodSandboxHookRequest, context: grpc.ServicerContext
    ) -> hooks_pb2.HookResponse:
        uid = request.pod.uid
        with self.ledger.lock:
            if self.ledger.runs_in_another_sandbox(pod_uid=uid, sandbox_id=request.pod.sandbox_id):
                # kubelet re-created the sandbox; the old one's stop came late (or again, from its garbage
                # collector): the pod's containers run in the new one, with these shares and cache directories.
                log.info(
                    "pod %s/%s (%s): old sandbox %s stopped; the pod runs in a newer one, its GPU shares stay",
                    request.pod.namespace, request.pod.name, uid, request.pod.sandbox_id,
                )
                return hooks_pb2.HookResponse()
            holds = self.ledger.pods().get(uid, ())
            released = bool(uid) and self.ledger.release(pod_uid=uid)
        # The destroys below run without the ledger's lock (`MIGLifecycle.pod_stopped`).
        if released:
            log.info("pod %s/%s (%s) stopped: its GPU shares are free again", request.pod.namespace, request.pod.name, uid)
            self._metrics.admitted_pods.set(len(self.ledger.pods()))
        if uid:
            self._pod_stopped(uid)
            if self._mig is not None:
                try:
                    self._mig.pod_stopped(uid, holds)
                except Exception:  # the sweep's reconcile tries again; the call must not fail
                    log.exception("MIG cleanup after pod %s failed", uid)
        return hooks_pb2.HookResponse()

    def PreRunPodSandbox(
        self, request: hooks_pb2.PodSandboxHookRequest, context: grpc.ServicerContext
    ) -> hooks_pb2.HookResponse:
        return hooks_pb2.HookResponse()

    def PostStartContainer(
        self, request: hooks_pb2.ContainerHookRequest, context: grpc.ServicerContext
    ) -> hooks_pb2.HookResponse:
        return hooks_pb2.HookResponse()

    def PostStopContainer(
        self, request: hooks_pb2.ContainerHookRequest, context: grpc.ServicerContext
    ) -> hooks_pb2.HookResponse:
        return hooks_pb2.HookResponse()

    def PreUpdateContainerResources(
        self, request: hooks_pb2.ContainerHookRequest, context: grpc.ServicerContext
    ) -> hooks_pb2.HookResponse:
        return hooks_pb2.HookResponse()

    def _without_mig(
        self, first: HookDecision, request: HookRequest, *, devices: NodeDevices, settings: HookSettings,
        held: dict[str, GPUHeld],
    ) -> HookDecision:
        reason = "this fgpu agent was started without MIG instance management, so it cannot create one"
        refused = {w: reason for w in first.mig_needed}
        return decide(request, devices=devices, settings=settings, held=held, mig_refused=refused)

    def _with_mig(
        self, first: HookDecision, claim: _Claim, request: HookRequest, *, devices: NodeDevices,
        settings: HookSettings,
    ) -> tuple[HookDecision, hooks_pb2.HookResponse, bool]:
        """The MIG instances `first` needs made (the claim is in the ledger, its lock not held), then the
        decision again under the lock: the claim confirmed with the instances' UUIDs, or rolled back."""
        assert self._mig is not None
        uid = request.pod_uid
        ready: dict[Want, str] = {}
        admitted = False
        try:
            ready, refused = self._mig.prepare(first.mig_needed)
            with self.ledger.lock:
                if uid not in self.ledger.pods():
                    # PostStopPodSandbox came meanwhile: the pod is gone, its instance goes with it.
                    decision = HookDecision(rejection=(
                        f"pod {request.pod_namespace}/{request.pod_name} ({uid}): its sandbox stopped while its MIG "
                        "instance was being made"
                    ))
                else:
                    held = self.ledger.held(excluding=uid)
                    decision = decide(
                        request, devices=devices, settings=settings, held=held, mig_ready=ready, mig_refused=refused
                    )
                response = self._response(decision)
                admitted = decision.edits is not None and not response.HasField("rejection")
                if admitted:
                    self.ledger.record(pod_uid=uid, holds=decision.holds, sandbox_id=request.sandbox_id)
                self._metrics.admitted_pods.set(len(self.ledger.pods()))
        finally:
            if not admitted:
                self._roll_back(uid, claim, made=bool(ready))
        return decision, response, admitted

    def _roll_back(self, uid: str, claim: _Claim, *, made: bool) -> None:
        """The pod's claim undone (unless its entry changed since: another container of it was admitted)."""
        with self.ledger.lock:
            if self.ledger.pods().get(uid) == claim.holds:
                if claim.before is None:
                    self.ledger.release(pod_uid=uid)
                else:
                    self.ledger.record(pod_uid=uid, holds=claim.before)
            self._metrics.admitted_pods.set(len(self.ledger.pods()))
        if made and self._mig is not None:
            try:  # an instance made (or found) for the refused claim goes again when no pod holds it
                self._mig.pod_stopped(uid, claim.holds)
            except Exception:
                log.exception("MIG cleanup after the refused admission of pod %s failed", uid)

    def _not_gone(self, decision: HookDecision, request: HookRequest) -> HookDecision:
        """`decision`, or a rejection when it hands out by UUID a MIG instance fgpu is destroying."""
        if self._mig is None or decision.rejection:
            return decision
        gone = sorted({h.mig_uuid for h in decision.holds if h.mig_uuid and self._mig.destroyed_lately(h.mig_uuid)})
        if not gone:
            return decision
        return HookDecision(rejection=(
            f"pod {request.pod_namespace}/{request.pod_name} ({request.pod_uid}): GPU allocation does not fit: MIG "
            f"instance(s) {', '.join(gone)} were destroyed by fgpu (made for a pod that has gone); the scheduler "
            "will see them gone in the next report, the pod must be scheduled again"
        ))

    def _pod_stopped(self, uid: str) -> None:
        """Every backend cleans up after the pod, not only the configured one: a node switched to
        another backend still holds what the old one left."""
        try:
            paths = self._settings().paths
        except SigningKeyError:
            return
        for backend in registry.backends():
            try:
                backend.on_pod_stopped(paths, pod_uid=uid)
            except Exception:  # one backend's cleanup must not skip the others' or fail the call
                log.exception("isolation backend %s: cleanup after pod %s failed", backend.name, uid)

    def _response(self, decision: HookDecision) -> hooks_pb2.HookResponse:
        if decision.rejection:
            self._metrics.hook_decisions.labels("rejected").inc()
            log.warning("GPU hook rejected a container: %s", decision.rejection)
            return hooks_pb2.HookResponse(rejection=hooks_pb2.Rejection(reason=decision.rejection))
        if decision.edits is None and decision.mig_needed:
            # Never "no answer" for a pod whose MIG instance was not made: the proxy would start it without.
            self._metrics.hook_decisions.labels("rejected").inc()
            reason = "fgpu agent: the MIG instance the allocation asks for was not made ready"
            return hooks_pb2.HookResponse(rejection=hooks_pb2.Rejection(reason=reason))
        if decision.edits is None:
            self._metrics.hook_decisions.labels("none").inc()
            return hooks_pb2.HookResponse()
        for path in decision.host_dirs:
            try:
                make_shared_dir(path)
            except OSError as err:
                reason = f"fgpu agent cannot create {path} for the GPU isolation library: {err.strerror}"
                self._metrics.hook_decisions.labels("rejected").inc()
                return hooks_pb2.HookResponse(rejection=hooks_pb2.Rejection(reason=reason))
        self._metrics.hook_decisions.labels("admitted").inc()
        return container_edits.to_proto(decision.edits)


def make_shared_dir(path: str) -> None:
    """Creates `path` (and its parents) writable by any user, with the sticky bit.

    HAMi-core writes its cache and lock files as the container's user, which need
    not be root; makedirs' mode is cut by the umask, so the mode is set explicitly.
    Sticky: on the node-wide lock directory one container's user cannot delete
    another's lock files.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        # Every GPU container's admission passes here, and the directories stay once made: one
        # lstat (a link is not a directory to it) instead of five syscalls when nothing is to change.
        if stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o1777 and st.st_uid == os.geteuid():
            return
    os.makedirs(path, exist_ok=True)
    # Opened without following a symlink, checked to be ours, then changed through the open
    # descriptor: a link planted at `path` must not make some other directory world-writable.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise PermissionError(
                errno.EPERM, f"{path} is owned by uid {owner}, not the agent's; remove it so the agent creates it"
            )
        os.fchmod(fd, 0o1777)
    finally:
        os.close(fd)


class HookServer:
    """The hook servicer on its socket, with health and reflection."""

    def __init__(self, *, listen: str, servicer: GPUHookServicer, workers: int = 4) -> None:
        self._listen = listen
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=list(CHANNEL_OPTIONS))
        hooks_pb2_grpc.add_RuntimeHooksServicer_to_server(servicer, self._server)  # type: ignore[no-untyped-call]
        add_health_and_reflection(self._server, [SERVICE_NAME])
        self._address: Address | None = None

    def start(self) -> None:
        self._address = add_listener(self._server, self._listen, field="--hook-listen")
        self._server.start()
        log.info("GPU hook listening on %s", self._listen)

    def stop(self, grace: float | None = 5.0) -> None:
        self._server.stop(grace).wait()
        if self._address is not None and self._address.unix_path:
            # A socket left behind would look like a live hook to the proxy's dialer.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._address.unix_path)
