"""Reading a live cluster's GPU state, shared by `fgpuctl inspect` and `fgpuctl defrag-plan`.

Two sources give the same per-GPU rows:

- `read_api(kubeconfig)`: Device resources + pod annotations from the Kubernetes API, rebuilt here
  by the scheduler's own loading code; it also keeps the Node facts (CPU/memory), the pods, and,
  when asked, the PodDisruptionBudgets. Given a verifier it counts allocations that do not verify
  as the scheduler does (`scheduler_plugin.boundpods`) and lists them; without one, nothing is
  checked and allocations are counted as written.
- `from_scheduler(address)`: a running scheduler's own view (GetNodeState); GPUs and shares only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from apis import grpc_server
from apis.devices import GPUInfo, gpu_from_proto
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_plugin.core.api import GPUView, NodeInfo, NodeView

if TYPE_CHECKING:
    from scheduler_plugin.boundpods import Unverified, Verifier

JSON = dict[str, Any]


@dataclass(frozen=True)
class PodShare:
    namespace: str
    name: str
    uid: str
    core_percent: int
    memory_bytes: int
    assumed: bool


@dataclass(frozen=True)
class GPURow:
    """One GPU as either source gives it: the agent's report of it, and what is allocated on it."""

    device: GPUInfo
    allocated_core_percent: int
    allocated_memory_bytes: int
    held_externally: bool
    pods: tuple[PodShare, ...]

    @property
    def model(self) -> str:
        """The model as fgpuctl shows it: the label form, else NVML's name."""
        return self.device.model_label or self.device.model


@dataclass(frozen=True)
class NodeRow:
    name: str
    driver_version: str
    discovery_error: str
    gpus: tuple[GPURow, ...]


@dataclass(frozen=True)
class UnverifiedRow:
    """A bound pod whose allocation does not verify, and what the scheduler counts for it instead."""

    namespace: str
    name: str
    uid: str
    node: str
    problem: str
    #: "last-verified", "request" or "nothing" (scheduler_plugin.boundpods.Basis)
    counted_as: str
    #: what is counted, summed over its GPUs
    core_percent: int
    memory_bytes: int
    message: str


@dataclass(frozen=True)
class ApiState:
    """What `read_api` saw at one moment."""

    rows: tuple[NodeRow, ...]
    #: Node facts by node name (allocatable CPU/memory, labels)
    nodes: Mapping[str, NodeInfo] = field(default_factory=dict)
    #: pods holding resources (assigned, not finished), by uid, as the API wrote them
    pods: Mapping[str, JSON] = field(default_factory=dict)
    #: policy/v1 PodDisruptionBudgets as the API wrote them (only when asked for)
    budgets: tuple[JSON, ...] = ()
    #: bound pods whose allocation does not verify; None when nothing was checked (no verifier)
    unverified: tuple[UnverifiedRow, ...] | None = None


def from_scheduler(address: str, nodes: Sequence[str]) -> list[NodeRow]:
    """GetNodeState of the scheduler at `address`; raises grpc.RpcError when it can't answer."""
    channel = grpc_server.insecure_channel(address, field="--scheduler")
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]
        response = stub.GetNodeState(scheduler_pb2.GetNodeStateRequest(node_names=list(nodes)), timeout=30)
    finally:
        channel.close()
    return [
        NodeRow(
            name=n.node_name,
            driver_version=n.driver_version,
            discovery_error=n.discovery_error,
            gpus=tuple(_gpu_row(g) for g in n.gpus),
        )
        for n in response.nodes
    ]


def from_api(kubeconfig: str, nodes: Sequence[str]) -> list[NodeRow]:
    return list(read_api(kubeconfig, nodes).rows)


def read_api(kubeconfig: str, nodes: Sequence[str], *, budgets: bool = False, verify: Verifier | None = None) -> ApiState:
    """Devices, Nodes and pods (and PodDisruptionBudgets when `budgets`) from the cluster at `kubeconfig`.

    With `verify`, allocations are checked and counted as the scheduler counts them.
    """
    from scheduler_plugin import pods as pod_objects
    from scheduler_plugin.backend_kubernetes import KubernetesBackend
    from scheduler_plugin.core.scheduler import Scheduler
    from scheduler_plugin.kube import Kube
    from scheduler_plugin.scheduling import SchedulingService

    kube = Kube.connect(kubeconfig=kubeconfig)
    try:
        backend = KubernetesBackend(kube)
        listing = backend.snapshot()
        service = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=None, verify=verify)
        service.load(listing)
        rows = tuple(_row(v) for v in service.node_views(list(nodes) or None))
        unverified = None if verify is None else tuple(_unverified_row(u) for u in service.unverified() if not nodes or u.node in nodes)
        found = tuple(kube.list_pod_disruption_budgets().items) if budgets else ()
    finally:
        kube.close()
    return ApiState(
        rows=rows,
        nodes={str(n.name): n for n in listing.nodes},
        pods={str(pod_objects.uid(p)): p for p in listing.pods},
        budgets=found,
        unverified=unverified,
    )


def _unverified_row(found: Unverified) -> UnverifiedRow:
    return UnverifiedRow(
        namespace=found.namespace,
        name=found.name,
        uid=found.uid,
        node=found.node,
        problem=found.problem,
        counted_as=found.basis.value,
        core_percent=sum(s.core_percent for s in found.counted.gpus),
        memory_bytes=sum(s.memory_bytes for s in found.counted.gpus),
        message=found.message(),
    )


def _row(view: NodeView) -> NodeRow:
    return NodeRow(
        name=view.name,
        driver_version=view.driver_version,
        discovery_error=view.discovery_error,
        gpus=tuple(_gpu_row(g) for g in view.gpus),
    )


def _gpu_row(g: scheduler_pb2.GPUState | GPUView) -> GPURow:
    """One GPU from either source: the scheduler's message carries the report's own `fgpu.v1.GPU`."""
    return GPURow(
        device=g.device if isinstance(g, GPUView) else gpu_from_proto(g.device),
        allocated_core_percent=g.allocated_core_percent,
        allocated_memory_bytes=g.allocated_memory_bytes,
        held_externally=g.held_externally,
        pods=tuple(PodShare(p.namespace, p.name, p.uid, p.core_percent, p.memory_bytes, p.assumed) for p in g.pods),
    )
