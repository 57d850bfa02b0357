"""The RuntimeHooks gRPC server: the runtime proxy's view of the GPU hook.

Thin: a request becomes a `agent.hook.HookRequest`, `agent.hook.decide`
answers, and the decision becomes a `HookResponse`. It listens on a unix
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

import grpc

from agent import hamicache
from agent.admissions import AdmissionLedger
from agent.hook import NO_ANSWER, HookDecision, HookRequest, HookSettings, decide
from agent.metrics import AgentMetrics
from apis import names
from apis.allocation import lists_gpus
from apis.devices import NodeDevices
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from apis.grpc_server import CHANNEL_OPTIONS, Address, add_health_and_reflection, add_listener
from apis.signing import SigningKeyError

log = logging.getLogger(__name__)

SERVICE_NAME = hooks_pb2.DESCRIPTOR.services_by_name["RuntimeHooks"].full_name


class GPUHookServicer(hooks_pb2_grpc.RuntimeHooksServicer):
    def __init__(
        self,
        *,
        devices: Callable[[], NodeDevices],
        settings: Callable[[], HookSettings],
        metrics: AgentMetrics | None = None,
        ledger: AdmissionLedger | None = None,
    ) -> None:
        """`settings` is called per request; it raises SigningKeyError while the key cannot be read."""
        self._devices = devices
        self._settings = settings
        self._metrics = metrics or AgentMetrics()
        self.ledger = ledger or AdmissionLedger()

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
                decision = decide(
                    hook_request,
                    devices=devices,
                    settings=settings,
                    held=self.ledger.held(excluding=hook_request.pod_uid),
                )
                response = self._response(decision)
                admitted = decision.edits is not None and not response.HasField("rejection")
                if admitted:
                    self.ledger.record(pod_uid=hook_request.pod_uid, holds=decision.holds)
                    self._metrics.admitted_pods.set(len(self.ledger.pods()))
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
        if uid and self.ledger.release(pod_uid=uid):
            log.info("pod %s/%s (%s) stopped: its GPU shares are free again", request.pod.namespace, request.pod.name, uid)
            self._metrics.admitted_pods.set(len(self.ledger.pods()))
        # The per-container HAMi cache directories of the pod are no longer used by anyone.
        hamicache.remove_pod_dirs(self._cache_root(), uid)
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

    def _cache_root(self) -> str:
        try:
            return self._settings().paths.hami_cache_root
        except SigningKeyError:
            return ""

    def _response(self, decision: HookDecision) -> hooks_pb2.HookResponse:
        if decision.rejection:
            self._metrics.hook_decisions.labels("rejected").inc()
            log.warning("GPU hook refused a container: %s", decision.rejection)
            return hooks_pb2.HookResponse(rejection=hooks_pb2.Rejection(reason=decision.rejection))
        if decision.edits is None:
            self._metrics.hook_decisions.labels("none").inc()
            return hooks_pb2.HookResponse()
        for path in decision.edits.host_dirs:
            try:
                make_shared_dir(path)
            except OSError as err:
                reason = f"fgpu agent cannot create {path} for the GPU isolation library: {err.strerror}"
                self._metrics.hook_decisions.labels("rejected").inc()
                return hooks_pb2.HookResponse(rejection=hooks_pb2.Rejection(reason=reason))
        self._metrics.hook_decisions.labels("admitted").inc()
        return hooks_pb2.HookResponse(
            set_envs=[hooks_pb2.KeyValue(key=k, value=v) for k, v in decision.edits.envs],
            unset_envs=list(decision.edits.unset_envs),
            add_mounts=[
                hooks_pb2.Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.readonly)
                for m in decision.edits.mounts
            ],
        )


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
