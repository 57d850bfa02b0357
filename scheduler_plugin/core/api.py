"""The decision core's public face: the types and the facade its adapters call.

The gRPC servicer, the kube-scheduler extender, the standalone loop, the state
backends (kubernetes, embedded) and the trace simulator all drive the core
through `Core` only, so there is one filter, one GPU choice and one scoring,
whoever asks. Everything here is plain data; the core does no I/O and reads
time only through the injected clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NewType, Protocol

from apis.allocation import Allocation
from apis.devices import GPUInfo, NodeDevices
from apis.mig import MIGMode
from apis.request import DeviceRequest
from scheduler_plugin.core.noderules import NodeRules, PodNodeNeeds

NodeName = NewType("NodeName", str)
PodUID = NewType("PodUID", str)
GPUUUID = NewType("GPUUUID", str)

Clock = Callable[[], float]


class Code(enum.Enum):
    """What a decision means for the caller (as in kube-scheduler's framework)."""

    #: The pod fits / the step succeeded.
    SUCCESS = enum.auto()
    #: Does not fit now; may fit after other pods leave (preemption could help).
    UNSCHEDULABLE = enum.auto()
    #: Can never fit on this node as it is (wrong model, too few GPUs in total).
    UNSCHEDULABLE_AND_UNRESOLVABLE = enum.auto()
    #: The pod itself is invalid or an internal error; retrying won't help.
    ERROR = enum.auto()


@dataclass(frozen=True)
class Status:
    code: Code
    reasons: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS


@dataclass(frozen=True)
class LabelRequirement:
    """One matchExpression of a required node affinity term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class PodRequest:
    """Everything the core needs to know about a pod, parsed once by an adapter.

    `device` is None for a pod that asks for no GPU (it still uses CPU/memory).
    """

    uid: PodUID
    namespace: str
    name: str
    device: DeviceRequest | None
    cpu_milli: int = 0
    memory_bytes: int = 0
    #: label-safe GPU models the pod may use; empty = any
    model_use: frozenset[str] = frozenset()
    #: label-safe GPU models the pod must not use
    model_avoid: frozenset[str] = frozenset()
    #: required topology scope for multi-GPU pods: "", "nvlink", "pcie", "numa", "node"
    topology_scope: str = ""
    #: pods sharing a job key get the GPU model chosen for the first of them; "" = none
    job_key: str = ""
    #: spec.nodeSelector
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: requiredDuringScheduling node affinity: OR over terms, AND inside a term
    affinity_terms: tuple[tuple[LabelRequirement, ...], ...] = ()
    #: tolerations and host ports, checked against NodeInfo.rules (core/noderules.py)
    node_needs: PodNodeNeeds = field(default_factory=PodNodeNeeds)
    #: the pod's `fgpu.io/gpu-mode`: MIG instances only, never MIG, or either (apis/mig.py)
    mig_mode: MIGMode = MIGMode.ANY

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NodeInfo:
    """The non-GPU facts of a node (from the Node object, or defaults for the embedded store)."""

    name: NodeName
    labels: Mapping[str, str] = field(default_factory=dict)
    cpu_milli: int = 0  # allocatable; 0 = not tracked
    memory_bytes: int = 0  # allocatable; 0 = not tracked
    #: taints, cordon, conditions, max pods (core/noderules.py); None = not known, nothing checked
    rules: NodeRules | None = None


@dataclass(frozen=True)
class NodeVerdict:
    node_name: NodeName
    feasible: bool
    reason: str = ""
    unresolvable: bool = False


@dataclass(frozen=True)
class PodShareView:
    uid: PodUID
    namespace: str
    name: str
    core_percent: int
    memory_bytes: int
    assumed: bool


@dataclass(frozen=True)
class GPUView:
    device: GPUInfo
    allocated_core_percent: int
    allocated_memory_bytes: int
    pods: tuple[PodShareView, ...]
    held_externally: bool


@dataclass(frozen=True)
class NodeView:
    name: NodeName
    gpus: tuple[GPUView, ...]
    driver_version: str = ""
    discovery_error: str = ""


class SchedulingError(Exception):
    """Reserve found the pod no longer fits (or is invalid); `status` says why."""

    def __init__(self, status: Status) -> None:
        super().__init__("; ".join(status.reasons) or status.code.name)
        self.status = status


class Core(Protocol):
    """The facade implemented by `scheduler_plugin.core.scheduler.Scheduler`."""

    # --- state feed (from Device resources / agent reports / pod informers) ---
    def upsert_node_devices(self, devices: NodeDevices) -> list[str]:
        """Sets a node's GPUs. Returns human-readable lines for allocations on GPUs that vanished."""
        ...

    def upsert_node_info(self, info: NodeInfo) -> None: ...

    def remove_node(self, name: NodeName) -> None: ...

    def add_pod(self, pod: PodRequest, node: NodeName, allocation: Allocation | None) -> None:
        """Records a bound pod (GPU or not) so its resources count as used. Idempotent per uid."""
        ...

    def remove_pod(self, uid: PodUID) -> None:
        """Forgets a pod (deleted, terminated). Idempotent."""
        ...

    # --- decisions ---
    def filter(self, pod: PodRequest, nodes: Sequence[NodeName] | None = None) -> list[NodeVerdict]: ...

    def score(self, pod: PodRequest, nodes: Sequence[NodeName]) -> list[tuple[NodeName, int]]:
        """Scores 0..100 (higher is better), in the order of `nodes`."""
        ...

    def select(self, pod: PodRequest, nodes: Sequence[NodeName] | None = None) -> NodeName | None:
        """Filter + score + the policy's tie-break; None when nothing fits."""
        ...

    def reserve(self, pod: PodRequest, node: NodeName) -> Allocation:
        """Chooses the GPUs and counts them as assumed. Raises SchedulingError."""
        ...

    def unreserve(self, uid: PodUID) -> None:
        """Releases an assumed allocation. Idempotent; a confirmed pod is left alone."""
        ...

    def confirm(self, uid: PodUID) -> None:
        """The bind succeeded: the assumed allocation becomes a bound one."""
        ...

    def expire_assumed(self) -> list[PodUID]:
        """Drops assumed allocations older than the TTL; returns their uids."""
        ...

    # --- views ---
    def node_views(self, names: Sequence[NodeName] | None = None) -> list[NodeView]: ...

    def allocation_of(self, uid: PodUID) -> tuple[NodeName, Allocation] | None: ...
