"""The few CRI calls kubelet makes to run a pod, as a small client.

The repository's CRI schema (`proto/cri/`) is the proxy's partial one and has
no command, log path or namespace options, and `grpcio-tools` is a test-only
dependency, so the messages kubelet needs are described here in Python and
built with protobuf's descriptor pool at import time. Field numbers are those
of `runtime.v1` in kubernetes/cri-api `pkg/apis/runtime/v1/api.proto`. The
package is `fgpu.localup.cri`, so it never collides with another schema in
the pool; the wire only carries field numbers and the method path.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from apis import names

PACKAGE = "fgpu.localup.cri"
SERVICE = f"/{names.CRI_RUNTIME_SERVICE}/"

_T = descriptor_pb2.FieldDescriptorProto
_STRING, _BYTES, _BOOL = _T.TYPE_STRING, _T.TYPE_BYTES, _T.TYPE_BOOL
_INT64, _INT32, _UINT32 = _T.TYPE_INT64, _T.TYPE_INT32, _T.TYPE_UINT32
_MSG, _ENUM = _T.TYPE_MESSAGE, _T.TYPE_ENUM
_REPEATED = "repeated"
_MAP = "map"

#: message -> (field name, number, type, type name or "", "repeated" / "map" / "")
_MESSAGES: dict[str, list[tuple[str, int, int, str, str]]] = {
    "KeyValue": [("key", 1, _STRING, "", ""), ("value", 2, _BYTES, "", "")],
    "PodSandboxMetadata": [
        ("name", 1, _STRING, "", ""),
        ("uid", 2, _STRING, "", ""),
        ("namespace", 3, _STRING, "", ""),
        ("attempt", 4, _UINT32, "", ""),
    ],
    "NamespaceOption": [
        ("network", 1, _ENUM, "NamespaceMode", ""),
        ("pid", 2, _ENUM, "NamespaceMode", ""),
        ("ipc", 3, _ENUM, "NamespaceMode", ""),
    ],
    "LinuxSandboxSecurityContext": [("namespace_options", 1, _MSG, "NamespaceOption", "")],
    "LinuxPodSandboxConfig": [
        ("cgroup_parent", 1, _STRING, "", ""),
        ("security_context", 2, _MSG, "LinuxSandboxSecurityContext", ""),
    ],
    "PodSandboxConfig": [
        ("metadata", 1, _MSG, "PodSandboxMetadata", ""),
        ("hostname", 2, _STRING, "", ""),
        ("log_directory", 3, _STRING, "", ""),
        ("labels", 6, _STRING, "", _MAP),
        ("annotations", 7, _STRING, "", _MAP),
        ("linux", 8, _MSG, "LinuxPodSandboxConfig", ""),
    ],
    "RunPodSandboxRequest": [("config", 1, _MSG, "PodSandboxConfig", ""), ("runtime_handler", 2, _STRING, "", "")],
    "RunPodSandboxResponse": [("pod_sandbox_id", 1, _STRING, "", "")],
    "PodSandboxIdRequest": [("pod_sandbox_id", 1, _STRING, "", "")],
    "Empty": [],
    "ImageSpec": [("image", 1, _STRING, "", "")],
    "ContainerMetadata": [("name", 1, _STRING, "", ""), ("attempt", 2, _UINT32, "", "")],
    "Int64Value": [("value", 1, _INT64, "", "")],
    "LinuxContainerSecurityContext": [
        ("namespace_options", 3, _MSG, "NamespaceOption", ""),
        ("run_as_user", 5, _MSG, "Int64Value", ""),
        ("run_as_group", 12, _MSG, "Int64Value", ""),
    ],
    "LinuxContainerConfig": [("security_context", 2, _MSG, "LinuxContainerSecurityContext", "")],
    "ContainerConfig": [
        ("metadata", 1, _MSG, "ContainerMetadata", ""),
        ("image", 2, _MSG, "ImageSpec", ""),
        ("command", 3, _STRING, "", _REPEATED),
        ("args", 4, _STRING, "", _REPEATED),
        ("envs", 6, _MSG, "KeyValue", _REPEATED),
        ("labels", 9, _STRING, "", _MAP),
        ("annotations", 10, _STRING, "", _MAP),
        ("log_path", 11, _STRING, "", ""),
        ("linux", 15, _MSG, "LinuxContainerConfig", ""),
    ],
    "CreateContainerRequest": [
        ("pod_sandbox_id", 1, _STRING, "", ""),
        ("config", 2, _MSG, "ContainerConfig", ""),
        ("sandbox_config", 3, _MSG, "PodSandboxConfig", ""),
    ],
    "CreateContainerResponse": [("container_id", 1, _STRING, "", "")],
    "ContainerIdRequest": [("container_id", 1, _STRING, "", "")],
    "StopContainerRequest": [("container_id", 1, _STRING, "", ""), ("timeout", 2, _INT64, "", "")],
    "ContainerStatus": [
        ("id", 1, _STRING, "", ""),
        ("state", 3, _ENUM, "ContainerState", ""),
        ("exit_code", 7, _INT32, "", ""),
        ("reason", 10, _STRING, "", ""),
        ("message", 11, _STRING, "", ""),
        ("log_path", 15, _STRING, "", ""),
    ],
    "ContainerStatusResponse": [("status", 1, _MSG, "ContainerStatus", "")],
    "ExecSyncRequest": [
        ("container_id", 1, _STRING, "", ""),
        ("cmd", 2, _STRING, "", _REPEATED),
        ("timeout", 3, _INT64, "", ""),
    ],
    "ExecSyncResponse": [
        ("stdout", 1, _BYTES, "", ""),
        ("stderr", 2, _BYTES, "", ""),
        ("exit_code", 3, _INT32, "", ""),
    ],
}

_ENUMS: dict[str, list[tuple[str, int]]] = {
    "NamespaceMode": [("POD", 0), ("CONTAINER", 1), ("NODE", 2), ("TARGET", 3)],
    "ContainerState": [
        ("CONTAINER_CREATED", 0),
        ("CONTAINER_RUNNING", 1),
        ("CONTAINER_EXITED", 2),
        ("CONTAINER_UNKNOWN", 3),
    ],
}

NAMESPACE_NODE = 2
CONTAINER_RUNNING = 1
CONTAINER_EXITED = 2

# The labels kubelet puts on every sandbox and container (pkg/kubelet/types/labels.go);
# runtimes and hooks read the pod and container they belong to from them.
POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
POD_UID_LABEL = "io.kubernetes.pod.uid"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="fgpu/localup/cri.proto", package=PACKAGE, syntax="proto3")
    for name, values in _ENUMS.items():
        enum = proto.enum_type.add(name=name)
        for value_name, number in values:
            enum.value.add(name=value_name, number=number)
    for name, fields in _MESSAGES.items():
        msg = proto.message_type.add(name=name)
        for field_name, number, kind, type_name, shape in fields:
            field = msg.field.add(name=field_name, number=number, type=kind)
            field.label = _T.LABEL_REPEATED if shape else _T.LABEL_OPTIONAL
            if type_name:
                field.type_name = f".{PACKAGE}.{type_name}"
            if shape == _MAP:
                # A map is a repeated nested "<Field>Entry" message with key and value.
                entry_name = "".join(p.capitalize() for p in field_name.split("_")) + "Entry"
                entry = msg.nested_type.add(name=entry_name)
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=_STRING, label=_T.LABEL_OPTIONAL)
                entry.field.add(name="value", number=2, type=kind, label=_T.LABEL_OPTIONAL)
                field.type = _MSG
                field.type_name = f".{PACKAGE}.{name}.{entry_name}"
    return proto


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in _MESSAGES
    }


M = _classes()


@dataclass(frozen=True)
class ExecResult:
    """What a command run in a container with ExecSync wrote, and its exit code."""

    stdout: str
    stderr: str
    exit_code: int


@dataclass(frozen=True)
class ContainerResult:
    """How a container ended: state, exit code, and what it wrote."""

    container_id: str
    exited: bool
    exit_code: int
    reason: str
    log_path: str


class CRIError(RuntimeError):
    """A CRI call failed; the message carries the method, the gRPC code and the runtime's words."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method}: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


class Kubelet:
    """Plays kubelet against a CRI endpoint: the calls, in the order kubelet makes them."""

    def __init__(self, address: str, *, timeout_s: float = 30.0) -> None:
        self._channel = grpc.insecure_channel(address)
        self._timeout_s = timeout_s

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any, response_type: str) -> Any:
        stub = self._channel.unary_unary(
            SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=M[response_type].FromString,
        )
        try:
            return stub(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise CRIError(method, exc.code(), exc.details() or "") from None

    def run_pod_sandbox(self, config: Any) -> str:
        response = self._call("RunPodSandbox", M["RunPodSandboxRequest"](config=config), "RunPodSandboxResponse")
        return str(response.pod_sandbox_id)

    def create_container(self, *, sandbox_id: str, config: Any, sandbox_config: Any) -> str:
        request = M["CreateContainerRequest"](pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config)
        return str(self._call("CreateContainer", request, "CreateContainerResponse").container_id)

    def start_container(self, container_id: str) -> None:
        self._call("StartContainer", M["ContainerIdRequest"](container_id=container_id), "Empty")

    def container_status(self, container_id: str) -> Any:
        request = M["ContainerIdRequest"](container_id=container_id)
        return self._call("ContainerStatus", request, "ContainerStatusResponse").status

    def wait_exited(self, container_id: str, *, timeout_s: float = 30.0) -> ContainerResult:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.container_status(container_id)
            if status.state == CONTAINER_EXITED or time.monotonic() > deadline:
                return ContainerResult(
                    container_id=container_id,
                    exited=status.state == CONTAINER_EXITED,
                    exit_code=int(status.exit_code),
                    reason=str(status.reason),
                    log_path=str(status.log_path),
                )
            time.sleep(0.05)

    def exec_sync(self, container_id: str, cmd: Sequence[str], *, timeout_s: int = 10) -> ExecResult:
        """Runs `cmd` in a running container; the process gets the container's own environment
        (the runtime copies the container's process spec), so `env` here prints what the
        container's main process was given."""
        request = M["ExecSyncRequest"](container_id=container_id, cmd=list(cmd), timeout=timeout_s)
        response = self._call("ExecSync", request, "ExecSyncResponse")
        return ExecResult(
            stdout=bytes(response.stdout).decode(errors="replace"),
            stderr=bytes(response.stderr).decode(errors="replace"),
            exit_code=int(response.exit_code),
        )

    def stop_container(self, container_id: str, *, timeout_s: int = 5) -> None:
        """Stops a container: its stop signal, then SIGKILL after `timeout_s` (0: SIGKILL at once)."""
        request = M["StopContainerRequest"](container_id=container_id, timeout=timeout_s)
        self._call("StopContainer", request, "Empty")

    def remove_container(self, container_id: str) -> None:
        self._call("RemoveContainer", M["ContainerIdRequest"](container_id=container_id), "Empty")

    def stop_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("StopPodSandbox", M["PodSandboxIdRequest"](pod_sandbox_id=sandbox_id), "Empty")

    def remove_pod_sandbox(self, sandbox_id: str) -> None:
        self._call("RemovePodSandbox", M["PodSandboxIdRequest"](pod_sandbox_id=sandbox_id), "Empty")


def sandbox_config(
    *,
    name: str,
    namespace: str,
    uid: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    log_directory: str,
    cgroup_parent: str = "",
) -> Any:
    """The sandbox config kubelet would send, in the host network (there is no CNI here).

    `cgroup_parent`: the pod's cgroup, as kubelet gives it (`pod_cgroup`); "" leaves the runtime's default,
    whose path names no pod."""
    node = M["NamespaceOption"](network=NAMESPACE_NODE)
    return M["PodSandboxConfig"](
        metadata=M["PodSandboxMetadata"](name=name, namespace=namespace, uid=uid, attempt=0),
        log_directory=log_directory,
        labels={**labels, POD_NAME_LABEL: name, POD_NAMESPACE_LABEL: namespace, POD_UID_LABEL: uid},
        annotations=dict(annotations),
        linux=M["LinuxPodSandboxConfig"](
            cgroup_parent=cgroup_parent,
            security_context=M["LinuxSandboxSecurityContext"](namespace_options=node),
        ),
    )


def pod_cgroup(uid: str) -> str:
    """The cgroup kubelet (cgroupfs driver) makes for a Burstable-QoS pod; the node agent maps a process
    to its pod by the `pod<uid>` in it (agent/cgroups.py)."""
    return f"/kubepods/burstable/pod{uid}"


def container_config(
    *,
    name: str,
    image: str,
    command: Sequence[str],
    args: Sequence[str],
    env: Mapping[str, str],
    log_path: str,
    labels: Mapping[str, str] | None = None,
    run_as_user: int | None = None,
    run_as_group: int | None = None,
    attempt: int = 0,
) -> Any:
    """A container config as kubelet builds it from the pod spec.

    `labels`: kubelet's own (`container_labels`); `run_as_user`/`run_as_group`: the container's
    effective securityContext (its own, else the pod's); None leaves the image's user.
    `attempt`: 0, then one more each time kubelet creates the container again.
    """
    node = M["NamespaceOption"](network=NAMESPACE_NODE)
    security = M["LinuxContainerSecurityContext"](namespace_options=node)
    if run_as_user is not None:
        security.run_as_user.value = run_as_user
    if run_as_group is not None:
        security.run_as_group.value = run_as_group
    return M["ContainerConfig"](
        metadata=M["ContainerMetadata"](name=name, attempt=attempt),
        image=M["ImageSpec"](image=image),
        command=list(command),
        args=list(args),
        envs=[M["KeyValue"](key=k, value=v.encode()) for k, v in env.items()],
        labels=dict(labels or {}),
        log_path=log_path,
        linux=M["LinuxContainerConfig"](security_context=security),
    )


def container_labels(*, pod_name: str, pod_namespace: str, pod_uid: str, container_name: str) -> dict[str, str]:
    """The labels kubelet puts on a container: its pod and its name in the pod spec."""
    return {
        POD_NAME_LABEL: pod_name,
        POD_NAMESPACE_LABEL: pod_namespace,
        POD_UID_LABEL: pod_uid,
        CONTAINER_NAME_LABEL: container_name,
    }
