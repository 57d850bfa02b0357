"""The driver's view of the sandboxes on the runtime, by pod UID, as kubelet keeps it.

kubelet never trusts that it knows every sandbox it asked for: a RunPodSandbox
whose answer was lost (a runtime restart, a proxy killed mid-call, a client
deadline) may still have made one. So it finds a pod's sandboxes by the pod
UID label kubelet puts on each (`io.kubernetes.pod.uid`) when it kills the pod
(`killPodWithSyncResult`) or makes a new one, and its garbage collector removes
sandboxes whose pod is gone. The driver does the same, through its proxy, and
only for sandboxes carrying its own node label.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from apis import names
from apis.cri.v1 import runtime_partial_pb2 as cri_pb
from hack.localup import cri

_LIST = f"/{names.CRI_RUNTIME_SERVICE}/ListPodSandbox"


@dataclass(frozen=True)
class Sandbox:
    id: str
    pod_uid: str
    ready: bool


class SandboxLister:
    def __init__(self, address: str, *, timeout_s: float = 10.0) -> None:
        self._channel = grpc.insecure_channel(address)
        self._timeout_s = timeout_s
        self._list = self._channel.unary_unary(
            _LIST,
            request_serializer=cri_pb.ListPodSandboxRequest.SerializeToString,
            response_deserializer=cri_pb.ListPodSandboxResponse.FromString,
        )

    def close(self) -> None:
        self._channel.close()

    def list(self, labels: Mapping[str, str]) -> list[Sandbox]:
        """Sandboxes carrying every label in `labels` (the runtime filters), ready or not."""
        request = cri_pb.ListPodSandboxRequest(filter=cri_pb.PodSandboxFilter(label_selector=dict(labels)))
        try:
            response = self._list(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise cri.CRIError("ListPodSandbox", code, details or "") from None
        return [Sandbox(id=s.id, pod_uid=s.metadata.uid, ready=s.state == cri_pb.SANDBOX_READY) for s in response.items]


def remove_all(kubelet: cri.Kubelet, lister: SandboxLister, labels: Mapping[str, str], *, keep: str = "") -> int:
    """Stops and removes every sandbox with `labels` but `keep` (RemovePodSandbox takes its containers
    too); the number removed. A CRI failure raises: the caller tries again later."""
    removed = 0
    for sandbox in lister.list(labels):
        if sandbox.id == keep:
            continue
        kubelet.stop_pod_sandbox(sandbox.id)
        kubelet.remove_pod_sandbox(sandbox.id)
        removed += 1
    return removed
