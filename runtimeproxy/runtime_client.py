"""Asks the runtime about containers and sandboxes, for calls that carry only an ID.

StartContainer, StopContainer, UpdateContainerResources and StopPodSandbox
name a container or sandbox by ID; the hooks want the pod. The proxy keeps no
state of its own, so it asks the runtime each time (and a proxy restart loses
nothing).
"""

from __future__ import annotations

import grpc
import grpc.aio

from apis import names
from apis.cri.v1 import runtime_partial_pb2 as cri
from apis.grpc_server import CHANNEL_OPTIONS, parse_address
from runtimeproxy.errors import RuntimeLookupError

_RUNTIME = f"/{names.CRI_RUNTIME_SERVICE}/"


class RuntimeClient:
    def __init__(self, backend: str, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        target = parse_address(backend, field="backend").grpc_target
        self._channel = grpc.aio.insecure_channel(target, options=list(CHANNEL_OPTIONS))
        self._list_containers = self._channel.unary_unary(
            _RUNTIME + "ListContainers",
            request_serializer=cri.ListContainersRequest.SerializeToString,
            response_deserializer=cri.ListContainersResponse.FromString,
        )
        self._sandbox_status = self._channel.unary_unary(
            _RUNTIME + "PodSandboxStatus",
            request_serializer=cri.PodSandboxStatusRequest.SerializeToString,
            response_deserializer=cri.PodSandboxStatusResponse.FromString,
        )

    async def container(self, container_id: str) -> cri.Container:
        try:
            resp = await self._list_containers(
                cri.ListContainersRequest(filter=cri.ContainerFilter(id=container_id)), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise RuntimeLookupError(f"ListContainers(id={container_id}): {exc.code().name}: {exc.details()}") from None
        matches = [c for c in resp.containers if c.id == container_id]
        if not matches and container_id:
            # containerd takes any unique prefix of an ID (crictl passes IDs as typed), as its filter did here
            matches = [c for c in resp.containers if c.id.startswith(container_id)]
        if len(matches) > 1:
            raise RuntimeLookupError(f"container id {container_id!r} is a prefix of {len(matches)} containers' ids")
        if not matches:
            raise RuntimeLookupError(f"container {container_id} not found in the runtime", not_found=True)
        found: cri.Container = matches[0]
        return found

    async def sandbox(self, sandbox_id: str) -> cri.PodSandboxStatus:
        try:
            resp = await self._sandbox_status(
                cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise RuntimeLookupError(
                f"PodSandboxStatus({sandbox_id}): {exc.code().name}: {exc.details()}",
                not_found=exc.code() == grpc.StatusCode.NOT_FOUND,
            ) from None
        status: cri.PodSandboxStatus = resp.status
        return status

    async def close(self) -> None:
        await self._channel.close(None)
