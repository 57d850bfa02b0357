"""A RuntimeHooks server for tests: answers like the GPU agent would, and can be stopped and restarted.

For a pod carrying an allocation (the DEVICE_ALLOCATED annotation) its
PreCreateContainer answer sets NVIDIA_VISIBLE_DEVICES to `GPU-<pod uid>` (so
each container can be checked for its own pod's value), HAMi-style limit
variables, a bind mount of a temp host dir at /fgpu-hook, and /dev/null as
/dev/fake-nvidia0. Pods without an allocation, or whose allocation lists no
GPU, get no edits, as the agent answers them. Every other stage of the
service is recorded and answered with no edits.

It checks no signature and gives every container the pod's GPUs: it stands in
for the agent only where the proxy's own behaviour is under test. The real
chain (scheduler, proxy, the agent's hook, containerd) is tests/e2e.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor

from apis import names
from apis.allocation import lists_gpus
from apis.fgpu.v1 import hooks_pb2
from apis.grpc_server import add_listener
from runtimeproxy.stages import Stages

MOUNT_PATH = "/fgpu-hook"
DEVICE_PATH = "/dev/fake-nvidia0"
MARKER_FILE = "marker.txt"
MARKER = "mounted by the test hook"
SM_LIMIT = "50"
MEMORY_LIMIT = "1024m"


def gpu_value(pod_uid: str) -> str:
    return f"GPU-{pod_uid}"


@dataclass
class HookBehaviour:
    """What the server does; tests change it between calls."""

    delay_s: float = 0.0
    reject: str = ""
    #: answer GPU pods with the environment only (no mount, no device): benchmarks use it so that
    #: runc's extra mount work does not hide what the proxy itself adds
    env_only: bool = False
    #: extra edits merged into every PreCreateContainer answer
    extra: Callable[[hooks_pb2.ContainerHookRequest], hooks_pb2.HookResponse] | None = None


@dataclass
class Recorded:
    stage: str
    request: Any


class _Handler(grpc.GenericRpcHandler):
    """Every method of the hooks service: recorded; PreCreateContainer answered as the agent would."""

    def __init__(self, owner: TestHookServer) -> None:
        self.owner = owner
        stages = Stages.of_service(owner.service)
        self.methods = {
            stages[method.name].path: grpc.unary_unary_rpc_method_handler(
                functools.partial(self._answer, method.name),
                request_deserializer=message_factory.GetMessageClass(method.input_type).FromString,
                response_serializer=hooks_pb2.HookResponse.SerializeToString,
            )
            for method in owner.service.methods
        }

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.methods.get(details.method)  # type: ignore[arg-type]

    def _answer(self, stage: str, request: Any, context: Any) -> hooks_pb2.HookResponse:
        with self.owner.lock:
            self.owner.calls.append(Recorded(stage, request))
        if self.owner.behaviour.delay_s:
            time.sleep(self.owner.behaviour.delay_s)
        return self._pre_create_container(request) if stage == "PreCreateContainer" else hooks_pb2.HookResponse()

    def _pre_create_container(self, request: hooks_pb2.ContainerHookRequest) -> hooks_pb2.HookResponse:
        b = self.owner.behaviour
        if b.reject:
            return hooks_pb2.HookResponse(rejection=hooks_pb2.Rejection(reason=b.reject))
        resp = hooks_pb2.HookResponse()
        if lists_gpus(request.pod.annotations.get(names.DEVICE_ALLOCATED)):
            resp.set_envs.extend([
                hooks_pb2.KeyValue(key=names.NVIDIA_VISIBLE_DEVICES, value=gpu_value(request.pod.uid)),
                hooks_pb2.KeyValue(key=names.HAMI_SM_LIMIT, value=SM_LIMIT),
                hooks_pb2.KeyValue(key=names.HAMI_MEMORY_LIMIT_PREFIX + "0", value=MEMORY_LIMIT),
            ])
            if not b.env_only:
                resp.add_mounts.append(
                    hooks_pb2.Mount(container_path=MOUNT_PATH, host_path=self.owner.host_dir, readonly=True)
                )
                resp.add_devices.append(hooks_pb2.Device(container_path=DEVICE_PATH, host_path="/dev/null", permissions="rw"))
        if b.extra is not None:
            resp.MergeFrom(b.extra(request))
        return resp


@dataclass
class TestHookServer:
    """Serves RuntimeHooks (or `service`, a hooks service with more stages) on `socket_path` while started."""

    socket_path: str
    behaviour: HookBehaviour = field(default_factory=HookBehaviour)
    service: ServiceDescriptor = hooks_pb2.DESCRIPTOR.services_by_name["RuntimeHooks"]
    calls: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    host_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="fgpu-hook-mount-"))
    _server: grpc.Server | None = None

    __test__ = False  # not a pytest class

    def __post_init__(self) -> None:
        with open(os.path.join(self.host_dir, MARKER_FILE), "w") as f:
            f.write(MARKER + "\n")
        os.chmod(self.host_dir, 0o755)

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self) -> TestHookServer:
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers((_Handler(self),))
        add_listener(server, self.endpoint)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def stages(self) -> list[str]:
        with self.lock:
            return [c.stage for c in self.calls]

    def requests(self, stage: str) -> list[Any]:
        with self.lock:
            return [c.request for c in self.calls if c.stage == stage]


def write_hook_config(directory: str, *, name: str, endpoint: str, stages: list[str], policy: str = "Fail",
                      timeout: str = "2s", file_name: str | None = None) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, file_name or f"50-{name}.yaml")
    stage_list = ", ".join(stages)
    with open(path, "w") as f:
        f.write(
            f"hooks:\n  - name: {name}\n    endpoint: {endpoint}\n    stages: [{stage_list}]\n"
            f"    failurePolicy: {policy}\n    timeout: {timeout}\n"
        )
    return path
