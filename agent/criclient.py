"""The agent's CRI client: asks the container runtime (containerd, CRI-O) for its pod sandboxes and containers.

The only agent module that imports the CRI messages. It dials the runtime's
own endpoint (the one kubelet is given), not the fgpu runtime proxy, so the
sweep does not depend on the proxy being up. Every call has a deadline, and
any gRPC failure becomes `agent.errors.RuntimeUnavailable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from agent.errors import RuntimeUnavailable
from apis import names
from apis.cri.v1 import runtime_partial_pb2 as cri
from apis.grpc_server import insecure_channel

REQUEST_TIMEOUT_S = 10.0
_LIST_POD_SANDBOX = f"/{names.CRI_RUNTIME_SERVICE}/ListPodSandbox"
_LIST_CONTAINERS = f"/{names.CRI_RUNTIME_SERVICE}/ListContainers"


@dataclass(frozen=True)
class Sandbox:
    """One pod sandbox as the runtime lists it; `pod_uid` is the Kubernetes pod UID.

    `annotations` are the pod's: kubelet copies them into the sandbox config,
    so the signed GPU allocation can be read here without Kubernetes.
    """

    id: str
    pod_uid: str
    ready: bool
    pod_name: str = ""
    pod_namespace: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: Creation time in nanoseconds since the epoch.
    created_at_ns: int = 0


class RuntimeClient:
    def __init__(self, endpoint: str, *, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        """`endpoint` as kubelet's --container-runtime-endpoint, e.g. unix:///run/containerd/containerd.sock."""
        self.endpoint = endpoint
        self._timeout = request_timeout_s
        # A channel connects lazily: a runtime that is down now fails the calls, not the agent's start.
        self._channel = insecure_channel(endpoint, field="runtimeEndpoint")
        self._list = self._channel.unary_unary(
            _LIST_POD_SANDBOX,
            request_serializer=cri.ListPodSandboxRequest.SerializeToString,
            response_deserializer=cri.ListPodSandboxResponse.FromString,
        )
        self._containers = self._channel.unary_unary(
            _LIST_CONTAINERS,
            request_serializer=cri.ListContainersRequest.SerializeToString,
            response_deserializer=cri.ListContainersResponse.FromString,
        )

    def list_pod_sandboxes(self) -> list[Sandbox]:
        """Every sandbox the runtime knows, ready or stopped; a removed one is not listed."""
        try:
            response = self._list(cri.ListPodSandboxRequest(), timeout=self._timeout)
        except grpc.RpcError as err:
            raise self._unavailable("ListPodSandbox", err) from err
        return [
            Sandbox(
                id=item.id,
                pod_uid=item.metadata.uid,
                ready=item.state == cri.SANDBOX_READY,
                pod_name=item.metadata.name,
                pod_namespace=item.metadata.namespace,
                annotations=dict(item.annotations),
                created_at_ns=item.created_at,
            )
            for item in response.items
        ]

    def sandboxes_with_containers(self) -> frozenset[str]:
        """The IDs of the sandboxes with at least one container created (running, exited or not yet started).

        The hook admits a pod at its first PreCreateContainer, so a container in a sandbox says its
        pod was admitted; the rebuild counts such pods first (`PodSeen.started`).
        """
        try:
            response = self._containers(cri.ListContainersRequest(), timeout=self._timeout)
        except grpc.RpcError as err:
            raise self._unavailable("ListContainers", err) from err
        return frozenset(c.pod_sandbox_id for c in response.containers if c.pod_sandbox_id)

    def _unavailable(self, call: str, err: grpc.RpcError) -> RuntimeUnavailable:
        code = err.code() if isinstance(err, grpc.Call) else None
        details = err.details() if isinstance(err, grpc.Call) else str(err)
        return RuntimeUnavailable(
            f"container runtime at {self.endpoint}: {call} failed "
            f"({code.name if code is not None else 'error'}: {details}); "
            "check that it runs and that runtimeEndpoint names its CRI socket"
        )

    def close(self) -> None:
        self._channel.close()
