"""Small hand-built clusters and the synthetic trace for the simulator tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from apis.allocation import Allocation, GPUShare
from scheduler_plugin.core.api import NodeName, PodUID
from scheduler_plugin.core.fragmentation import PodShape, TargetWorkload
from scheduler_plugin.core.policies import policy_names
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.replay import SIM_GPU_MEMORY_BYTES, build_scheduler, pod_request
from scheduler_plugin.sim.trace import TraceNode, TracePod

DATA = Path(__file__).parent / "data"
NODES_CSV = DATA / "nodes.csv"
PODS_CSV = DATA / "pods.csv"  # asks for 0.9x capacity: tuning clones
PODS_HEAVY_CSV = DATA / "pods_heavy.csv"  # asks for 2.6x capacity: tuning drops

#: every policy of the core (the registry's; a test-registered one is the contract test's business)
ALL_POLICIES = tuple(policy_names(builtin_only=True))
#: policies that pack shares and keep whole GPUs free
PACKING_POLICIES = ("bestfit", "fgd", "fgpu", "binpack")

#: whole 1-GPU pods, half GPUs and CPU-only pods, as a target workload for hand-built clusters
WORKLOAD = TargetWorkload(
    shapes=(
        PodShape(cpu_milli=4000, gpu_milli=1000, num_gpu=1),
        PodShape(cpu_milli=2000, gpu_milli=500, num_gpu=1),
        PodShape(cpu_milli=2000, gpu_milli=0, num_gpu=0),
    ),
    weights=(0.5, 0.3, 0.2),
)


def node(name: str, *, gpus: int, cpu: int = 32000, memory_mib: int = 65536, model: str = "G2") -> TraceNode:
    return TraceNode(name=name, cpu_milli=cpu, memory_mib=memory_mib, gpus=gpus, model=model)


def pod(
    name: str, *, milli: int = 0, gpus: int = 1, cpu: int = 1000, memory_mib: int = 1024, spec: Sequence[str] = ()
) -> TracePod:
    return TracePod(
        name=name,
        cpu_milli=cpu,
        memory_mib=memory_mib,
        num_gpu=gpus if milli else 0,
        gpu_milli=milli,
        gpu_spec=tuple(spec),
    )


def cluster(policy: str, nodes: Sequence[TraceNode], *, seed: int = 0, workload: TargetWorkload = WORKLOAD) -> Scheduler:
    return build_scheduler(nodes, policy=policy, seed=seed, workload=workload)


def occupy(core: Scheduler, node_name: str, gpu_percents: Sequence[int], *, cpu: int = 0, name: str = "") -> None:
    """Binds a pre-existing pod that holds `gpu_percents[i]` % of GPU i (0 = none) and `cpu` milli."""
    shares = tuple(
        GPUShare(
            minor=i,
            uuid=f"GPU-{node_name}-{i}",
            core_percent=percent,
            memory_bytes=SIM_GPU_MEMORY_BYTES * percent // 100,
            memory_ratio_percent=percent,
        )
        for i, percent in enumerate(gpu_percents)
        if percent
    )
    holder = pod(name or f"holder-{node_name}-{len(core.pod_uids())}", cpu=cpu)
    core.add_pod(pod_request(holder), NodeName(node_name), Allocation(gpus=shares) if shares else None)


def gpus_of(core: Scheduler, trace_pod: TracePod) -> tuple[str, tuple[int, ...]] | None:
    """(node, GPU minors) a placed pod got."""
    found = core.allocation_of(PodUID(trace_pod.name))
    if found is None:
        return None
    node_name, allocation = found
    return str(node_name), tuple(share.minor for share in allocation.gpus)
