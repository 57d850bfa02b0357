"""A stand-in for kubelet: builds full CRI requests and drives a pod's life through a CRI endpoint.

    k = Kubelet("unix:///tmp/proxy.sock")
    pod = k.run_pod(PodSpec(name="p", annotations={...}))
    cid = k.create_container(pod, ContainerSpec(name="c", image="fgpu.local/busybox:1", command=["env"]))
    k.start_container(cid)
    k.wait_exited(cid)
    print(k.read_log(cid))

The CRI messages come from `kubelet_cri.proto` beside this file, compiled
with grpc_tools on first use into a temp dir (once per process).
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import grpc

from apis import names
from apis.grpc_server import CHANNEL_OPTIONS, parse_address

RUNTIME = f"/{names.CRI_RUNTIME_SERVICE}/"
IMAGE = f"/{names.CRI_IMAGE_SERVICE}/"
NAMESPACE_NODE = 2
STATE_EXITED = 2

_lock = threading.Lock()
_module: ModuleType | None = None


def messages() -> Any:
    """The compiled test CRI messages (module `kubelet_cri_pb2`)."""
    global _module
    with _lock:
        if _module is None:
            from grpc_tools import protoc

            here = os.path.dirname(os.path.abspath(__file__))
            out = tempfile.mkdtemp(prefix="fgpu-kubelet-cri-")
            rc = protoc.main(["protoc", f"-I{here}", f"--python_out={out}", os.path.join(here, "kubelet_cri.proto")])
            if rc != 0:
                raise RuntimeError(f"protoc failed ({rc}) on tests/runtimeproxy/kubelet_cri.proto")
            spec = importlib.util.spec_from_file_location("kubelet_cri_pb2", os.path.join(out, "kubelet_cri_pb2.py"))
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _module = module
        return _module


@dataclass
class PodSpec:
    name: str
    namespace: str = "default"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class ContainerSpec:
    name: str
    image: str = "fgpu.local/busybox:1"
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    envs: dict[str, str] = field(default_factory=dict)
    working_dir: str = ""
    future_field: str = ""


@dataclass
class Pod:
    spec: PodSpec
    sandbox_id: str
    config: Any
    log_dir: str


class Kubelet:
    """CRI calls as kubelet makes them, against one endpoint (the proxy or containerd directly)."""

    def __init__(self, address: str, *, log_root: str | None = None, timeout_s: float = 60.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.m = messages()
        self.channel = grpc.insecure_channel(parse_address(address).grpc_target, options=list(CHANNEL_OPTIONS))
        self.log_root = log_root or tempfile.mkdtemp(prefix="fgpu-pod-logs-")
        self._calls: dict[tuple[str, str], Any] = {}

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Kubelet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing -----------------------------------------------------------------------------------

    def call(self, path: str, request: Any, response_type: Any, *, timeout: float | None = None,
             metadata: tuple[tuple[str, str], ...] | None = None) -> Any:
        key = (path, response_type.DESCRIPTOR.full_name)
        fn = self._calls.get(key)
        if fn is None:
            fn = self.channel.unary_unary(
                path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=response_type.FromString
            )
            self._calls[key] = fn
        return fn(request, timeout=timeout or self.timeout_s, metadata=metadata)

    def raw(self, path: str, payload: bytes, *, timeout: float | None = None,
            metadata: tuple[tuple[str, str], ...] | None = None) -> tuple[bytes, Any]:
        """A call on raw bytes; returns (response bytes, the call for trailing metadata)."""
        fn = self.channel.unary_unary(path)
        result: bytes
        result, call = fn.with_call(payload, timeout=timeout or self.timeout_s, metadata=metadata)
        return result, call

    # --- RuntimeService -----------------------------------------------------------------------------

    def version(self) -> Any:
        return self.call(RUNTIME + "Version", self.m.VersionRequest(version="v1"), self.m.VersionResponse)

    def pod_config(self, spec: PodSpec) -> Any:
        m = self.m
        log_dir = os.path.join(self.log_root, f"{spec.namespace}_{spec.name}_{spec.uid}")
        os.makedirs(log_dir, exist_ok=True)
        return m.PodSandboxConfig(
            metadata=m.PodSandboxMetadata(name=spec.name, uid=spec.uid, namespace=spec.namespace, attempt=0),
            log_directory=log_dir,
            labels={"io.kubernetes.pod.name": spec.name, "io.kubernetes.pod.namespace": spec.namespace,
                    "io.kubernetes.pod.uid": spec.uid, **spec.labels},
            annotations=spec.annotations,
            # no CNI here: pods share the host network namespace
            linux=m.LinuxPodSandboxConfig(
                security_context=m.LinuxSandboxSecurityContext(
                    namespace_options=m.NamespaceOption(network=NAMESPACE_NODE)
                )
            ),
        )

    def run_pod(self, spec: PodSpec) -> Pod:
        config = self.pod_config(spec)
        resp = self.call(RUNTIME + "RunPodSandbox", self.m.RunPodSandboxRequest(config=config), self.m.RunPodSandboxResponse)
        return Pod(spec=spec, sandbox_id=resp.pod_sandbox_id, config=config, log_dir=config.log_directory)

    def create_container_request(self, pod: Pod, spec: ContainerSpec) -> Any:
        m = self.m
        config = m.ContainerConfig(
            metadata=m.ContainerMetadata(name=spec.name),
            image=m.ImageSpec(image=spec.image),
            command=spec.command,
            args=spec.args,
            working_dir=spec.working_dir,
            envs=[m.KeyValue(key=k, value=v.encode()) for k, v in spec.envs.items()],
            labels={"io.kubernetes.container.name": spec.name},
            log_path=f"{spec.name}/0.log",
            fgpu_future_field=spec.future_field,
        )
        return m.CreateContainerRequest(pod_sandbox_id=pod.sandbox_id, config=config, sandbox_config=pod.config)

    def create_container(self, pod: Pod, spec: ContainerSpec) -> str:
        req = self.create_container_request(pod, spec)
        resp = self.call(RUNTIME + "CreateContainer", req, self.m.CreateContainerResponse)
        container_id: str = resp.container_id
        return container_id

    def start_container(self, container_id: str) -> None:
        self.call(RUNTIME + "StartContainer", self.m.ContainerIdRequest(container_id=container_id), self.m.Empty)

    def stop_container(self, container_id: str, timeout: int = 0) -> None:
        self.call(RUNTIME + "StopContainer", self.m.StopContainerRequest(container_id=container_id, timeout=timeout),
                  self.m.Empty)

    def remove_container(self, container_id: str) -> None:
        self.call(RUNTIME + "RemoveContainer", self.m.ContainerIdRequest(container_id=container_id), self.m.Empty)

    def container_status(self, container_id: str) -> Any:
        return self.call(RUNTIME + "ContainerStatus", self.m.ContainerStatusRequest(container_id=container_id),
                         self.m.ContainerStatusResponse).status

    def runtime_spec(self, container_id: str) -> dict[str, Any]:
        """The OCI spec containerd made for the container (ContainerStatus verbose info)."""
        resp = self.call(RUNTIME + "ContainerStatus",
                         self.m.ContainerStatusRequest(container_id=container_id, verbose=True),
                         self.m.ContainerStatusResponse)
        spec: dict[str, Any] = json.loads(resp.info["info"])["runtimeSpec"]
        return spec

    def list_containers(self, **filter_fields: Any) -> list[Any]:
        req = self.m.ListContainersRequest(filter=self.m.ContainerFilter(**filter_fields))
        return list(self.call(RUNTIME + "ListContainers", req, self.m.ListContainersResponse).containers)

    def update_resources(self, container_id: str, **linux: Any) -> None:
        req = self.m.UpdateContainerResourcesRequest(container_id=container_id,
                                                     linux=self.m.LinuxContainerResources(**linux))
        self.call(RUNTIME + "UpdateContainerResources", req, self.m.Empty)

    def sandbox_status(self, sandbox_id: str) -> Any:
        return self.call(RUNTIME + "PodSandboxStatus", self.m.PodSandboxIdRequest(pod_sandbox_id=sandbox_id),
                         self.m.PodSandboxStatusResponse).status

    def stop_pod(self, pod: Pod) -> None:
        self.call(RUNTIME + "StopPodSandbox", self.m.PodSandboxIdRequest(pod_sandbox_id=pod.sandbox_id), self.m.Empty)

    def remove_pod(self, pod: Pod) -> None:
        self.call(RUNTIME + "RemovePodSandbox", self.m.PodSandboxIdRequest(pod_sandbox_id=pod.sandbox_id), self.m.Empty)

    # --- a pod's life --------------------------------------------------------------------------------

    def wait_exited(self, container_id: str, *, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.container_status(container_id)
            if status.state == STATE_EXITED:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"container {container_id} still in state {status.state} after {timeout_s}s")
            time.sleep(0.05)

    def read_log(self, pod: Pod, spec: ContainerSpec) -> str:
        """The container's stdout/stderr, from the CRI log file (`<time> <stream> <tag> <line>`)."""
        path = os.path.join(pod.log_dir, f"{spec.name}/0.log")
        lines = []
        with open(path) as f:
            for raw in f:
                parts = raw.rstrip("\n").split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else "")
        return "\n".join(lines)

    def run_to_completion(self, pod: Pod, spec: ContainerSpec) -> tuple[str, Any]:
        """Create, start, wait for exit, read the log, remove: (log text, final status)."""
        cid = self.create_container(pod, spec)
        self.start_container(cid)
        status = self.wait_exited(cid)
        text = self.read_log(pod, spec)
        self.remove_container(cid)
        return text, status

    def teardown(self, pod: Pod) -> None:
        self.stop_pod(pod)
        self.remove_pod(pod)


def env_of(log_text: str) -> dict[str, str]:
    """`env` output as a dict."""
    out = {}
    for line in log_text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out
