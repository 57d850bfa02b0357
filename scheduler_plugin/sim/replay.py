"""Replaying a trace through the real scheduler core, one seed at a time.

Every placement is `Scheduler.select` + `reserve` + `confirm`: the same filter, GPU choice and
scoring the scheduler service runs, with the policy chosen by name. Trace pods become pod
requests: `gpu_milli/10` is both the core % and the memory ratio % of each of `num_gpu` cards
(whole cards when gpu_milli is 1000), `gpu_spec` is the allowed model list.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from apis.devices import GPUInfo, NodeDevices
from apis.request import DeviceRequest
from scheduler_plugin.core.api import NodeInfo, NodeName, PodRequest, PodUID, SchedulingError
from scheduler_plugin.core.fragmentation import TargetWorkload
from scheduler_plugin.core.policy_fgd import FragmentationTracker
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.sim.records import FRAG_WINDOW, HEADLINE_ARRIVED, Records, headline
from scheduler_plugin.sim.trace import MIB, MILLI_PER_GPU, TraceNode, TracePod
from scheduler_plugin.sim.workload import gpu_capacity_milli, order_and_tune, typical_shapes

#: GPU memory given to every simulated GPU: a multiple of 100 bytes, so ratio shares are exact.
SIM_GPU_MEMORY_BYTES = 16 * 1000**3
NAMESPACE = "trace"


@dataclass(frozen=True)
class RunResult:
    policy: str
    seed: int
    records: Records
    alloc_at_100: float
    frag_at_100: float
    pods: int
    placed: int
    failed: int
    clones: int
    dropped: int
    seconds: float


def node_devices(node: TraceNode) -> NodeDevices:
    gpus = tuple(
        GPUInfo(
            uuid=f"GPU-{node.name}-{i}",
            minor=i,
            index=i,
            model=node.model,
            model_label=node.model,
            memory_bytes=SIM_GPU_MEMORY_BYTES,
        )
        for i in range(node.gpus)
    )
    return NodeDevices(node_name=node.name, gpus=gpus)


def pod_request(pod: TracePod) -> PodRequest:
    device = None
    if pod.num_gpu:
        percent = pod.gpu_milli * 100 // MILLI_PER_GPU
        device = DeviceRequest(
            gpus=pod.num_gpu,
            core_percent=percent,
            memory_bytes=None,
            memory_ratio_percent=percent,
            whole=pod.gpu_milli == MILLI_PER_GPU,
            source="trace",
        )
    return PodRequest(
        uid=PodUID(pod.name),
        namespace=NAMESPACE,
        name=pod.name,
        device=device,
        cpu_milli=pod.cpu_milli,
        memory_bytes=pod.memory_mib * MIB,
        model_use=frozenset(pod.gpu_spec),
    )


def build_scheduler(
    nodes: Sequence[TraceNode],
    *,
    policy: str,
    seed: int,
    workload: TargetWorkload | None,
    params: Mapping[str, float] | None = None,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Scheduler:
    """A fresh core holding the trace's GPU nodes, ties broken by a node order fixed by `seed`.

    `workload` None leaves the policy without a target workload, as in a live cluster: fgd and
    fgpu then learn it from the pods they are asked to place.
    """
    core = Scheduler(
        policy=policy,
        tie_break_seed=seed,
        policy_params=params or {},
        policy_options={} if workload is None else {"workload": workload},
    )
    for node in nodes:
        if node.gpus == 0:
            continue  # the protocol replays GPU nodes only
        core.upsert_node_info(
            NodeInfo(
                name=NodeName(node.name),
                labels=dict((node_labels or {}).get(node.name, {})),
                cpu_milli=node.cpu_milli,
                memory_bytes=node.memory_mib * MIB,
            )
        )
        core.upsert_node_devices(node_devices(node))
    return core


def place(core: Scheduler, pod: TracePod) -> NodeName | None:
    """Schedules one trace pod as the service would (select, reserve, confirm); None when it fails."""
    request = pod_request(pod)
    node = core.select(request)
    if node is None:
        return None
    try:
        core.reserve(request, node)
    except SchedulingError:
        return None
    core.confirm(request.uid)
    return node


def replay(
    *,
    nodes: Sequence[TraceNode],
    pods: Sequence[TracePod],
    policy: str,
    seed: int,
    tune: float | None = 1.3,
    params: Mapping[str, float] | None = None,
    learn_workload: bool = False,
) -> RunResult:
    """One run of the protocol: order and tune the pods with `seed`, place them one by one.

    With `learn_workload` the policy is not told the trace's typical shapes and learns them from
    the pods as they arrive (the live scheduler's situation); fragmentation is still reported
    against the trace's typical shapes.
    """
    started = time.perf_counter()
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    capacity = gpu_capacity_milli(gpu_nodes)
    if capacity <= 0:
        raise ValueError("the node list has no GPU; the replay needs at least one GPU node")
    workload = typical_shapes(pods)
    run = order_and_tune(pods, capacity_milli=capacity, seed=seed, tune=tune)
    core = build_scheduler(
        gpu_nodes, policy=policy, seed=seed, workload=None if learn_workload else workload, params=params
    )
    # An observer of the core's state: FGD's measure, whatever the policy.
    observer = FragmentationTracker(core.state, workload)
    core.state.add_listener(observer)

    arrived_milli = 0
    allocated_milli = 0
    placed = failed = 0
    arrived_pct = [0.0]
    alloc_pct = [0.0]
    frag_pct = [float("nan")]
    for position, pod in enumerate(run.pods):
        arrived_milli += pod.total_gpu_milli
        if place(core, pod) is None:
            failed += 1
        else:
            placed += 1
            allocated_milli += pod.total_gpu_milli
        arrived = arrived_milli / capacity * 100
        arrived_pct.append(arrived)
        alloc_pct.append(round(allocated_milli / capacity * 100, 2))
        upcoming = run.pods[position + 1].total_gpu_milli if position + 1 < len(run.pods) else 0
        last_below = arrived <= HEADLINE_ARRIVED < (arrived_milli + upcoming) / capacity * 100
        if FRAG_WINDOW[0] <= arrived <= FRAG_WINDOW[1] or last_below:
            observer.refresh()
            frag_pct.append(observer.index.total() / capacity * 100)
        else:
            frag_pct.append(float("nan"))
    records = Records(arrived_pct=tuple(arrived_pct), alloc_pct=tuple(alloc_pct), frag_pct=tuple(frag_pct))
    return RunResult(
        policy=policy,
        seed=seed,
        records=records,
        alloc_at_100=headline(records.alloc_pct, records.arrived_pct),
        frag_at_100=headline(records.frag_pct, records.arrived_pct),
        pods=len(run.pods),
        placed=placed,
        failed=failed,
        clones=run.clones,
        dropped=run.dropped,
        seconds=time.perf_counter() - started,
    )
