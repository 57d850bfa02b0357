"""Where `fgpuctl ui` gets the cluster: a snapshot file, a running scheduler, or the Kubernetes API.

Each source gives the same `ui_model.Gathered`: the per-GPU rows `fgpuctl inspect` prints, the
pending GPU pods with the scheduler's per-node reasons, FGD's fragmentation, and the planner's
snapshot of the cluster (the one `fgpuctl defrag-plan` plans on, `live_snapshot.py`) for the
defrag plan, which `ui_plan.py` makes apart from the sample. Fragmentation is worked out on that
snapshot with the simulator's own code: a scheduler core holding the snapshot and
`FragmentationTracker` against the typical shapes of its pods, as `scheduler_plugin/sim/replay.py`
measures a replay.

Pending reasons:
- snapshot: the file's optional `"pending"` list (pods as in `"pods"`, without `node`/`gpus`),
  each filtered by a scheduler core holding the snapshot;
- kubeconfig: every pod addressed to fgpu-scheduler and not yet bound, filtered by the
  scheduler's own service loaded from the API (the same verdicts its Filter gives), and the
  message the scheduler last wrote on the pod (its PodScheduled condition);
- scheduler: not reachable (GetNodeState holds no pending pods); the page says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fgpuctl import api_errors
from fgpuctl.cluster_state import ApiState, GPURow, NodeRow, PodShare
from fgpuctl.ui_model import Gathered, Pending, PendingPod, Planning

if TYPE_CHECKING:
    from scheduler_plugin.core.api import NodeVerdict, NodeView
    from scheduler_plugin.core.scheduler import Scheduler
    from scheduler_plugin.sim.snapshot import Snapshot
    from scheduler_plugin.sim.trace import TracePod

Collect = Callable[[], Gathered]

SCHEDULER_PENDING_NOTE = (
    "pending pods are not reachable from --scheduler: GetNodeState carries bound pods only; "
    "run fgpuctl ui --kubeconfig FILE to see them with the scheduler's per-node reasons"
)


def label(kind: str, where: str) -> str:
    """How the page names a source ("kubeconfig ~/.kube/config"), before and after its first sample."""
    return f"{kind} {where or '(default)'}"


class SourceError(RuntimeError):
    """The source can't be read; the message names the flag, the value and what went wrong."""


def from_snapshot_file(path: str) -> Collect:
    def collect() -> Gathered:
        import json
        from pathlib import Path

        from scheduler_plugin.sim.snapshot import SnapshotError, load_snapshot

        try:
            snapshot = load_snapshot(path)
            pending = _pending_from_json(json.loads(Path(path).read_text()).get("pending") or [])
        except SnapshotError as exc:
            raise SourceError(f"--snapshot={path}: {exc}") from None
        core, percent, per_node = _fragmentation(snapshot)
        rows = tuple(_row(v, split_names=True) for v in core.node_views())
        verdicts = [(pod, core.filter(_request(pod))) for pod in pending]
        return Gathered(
            source=label("snapshot", path),
            rows=rows,
            pending=Pending(reachable=True, pods=tuple(_pending_pod(p, v) for p, v in verdicts)),
            fragmentation_percent=percent,
            fragmentation_milli=per_node,
            planning=Planning(snapshot),
        )

    return collect


def from_scheduler(address: str) -> Collect:
    def collect() -> Gathered:
        import grpc

        from fgpuctl import cluster_state
        from fgpuctl.live_snapshot import LiveStateError, snapshot_from_scheduler

        try:
            rows = tuple(cluster_state.from_scheduler(address, ()))
        except grpc.RpcError as exc:
            raise SourceError(f"--scheduler={address}: {exc.code().name}: {exc.details()}") from None
        return _gathered(label("scheduler", address), rows, Pending(reachable=False, note=SCHEDULER_PENDING_NOTE),
                         live=lambda: snapshot_from_scheduler(rows), errors=(LiveStateError,))

    return collect


def from_api(kubeconfig: str) -> Collect:
    def collect() -> Gathered:
        from fgpuctl.live_snapshot import LiveStateError, snapshot_from_api

        try:
            state, pending = _read_api(kubeconfig)
        except Exception as exc:  # an unreachable or refusing API server: one line, as fgpuctl inspect says it
            message = api_errors.explain(exc)
            if not message.startswith(("--kubeconfig", "no --kubeconfig")):  # a kubeconfig that cannot be loaded says so
                message = f"--kubeconfig={kubeconfig or '(default)'}: {message}"
            raise SourceError(message) from None
        return _gathered(label("kubeconfig", kubeconfig), state.rows, pending,
                         live=lambda: snapshot_from_api(state), errors=(LiveStateError,))

    return collect


def _gathered(
    source: str, rows: tuple[NodeRow, ...], pending: Pending, *, live: Callable[[], Any], errors: tuple[type[Exception], ...],
) -> Gathered:
    try:
        planned = live()
    except errors as exc:  # e.g. no GPU node yet: the view still shows what there is
        return Gathered(source=source, rows=rows, pending=pending, fragmentation_percent=None,
                        notes=(f"no fragmentation or defrag plan: {exc}",))
    _, percent, per_node = _fragmentation(planned.snapshot)
    return Gathered(
        source=source,
        rows=rows,
        pending=pending,
        fragmentation_percent=percent,
        fragmentation_milli=per_node,
        planning=Planning(planned.snapshot, notes=planned.notes),
    )


def _read_api(kubeconfig: str) -> tuple[ApiState, Pending]:
    """What `cluster_state.read_api` reads, and the pending pods filtered by the same loaded service."""
    from scheduler_plugin import pods as pod_objects
    from scheduler_plugin.backend_kubernetes import KubernetesBackend
    from scheduler_plugin.core.scheduler import Scheduler
    from scheduler_plugin.kube import Kube
    from scheduler_plugin.scheduling import SchedulingService

    kube = Kube.connect(kubeconfig=kubeconfig)
    try:
        backend = KubernetesBackend(kube)
        listing = backend.snapshot()
        service = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=None)
        service.load(listing)
        rows = tuple(_row(v, split_names=False) for v in service.node_views(None))
        waiting = [p for p in kube.list_pods().items if pod_objects.wants_us(p)]
        budgets = tuple(kube.list_pod_disruption_budgets().items)
    finally:
        kube.close()
    found = []
    for pod in sorted(waiting, key=pod_objects.key):
        outcome = service.filter(pod)
        if not outcome.pod_error and _asks_no_gpu(service, pod):
            continue
        found.append(_pending_from_api(pod, outcome.verdicts, outcome.pod_error))
    state = ApiState(
        rows=rows,
        nodes={str(n.name): n for n in listing.nodes},
        pods={str(pod_objects.uid(p)): p for p in listing.pods},
        budgets=budgets,
    )
    return state, Pending(reachable=True, pods=tuple(found))


def _asks_no_gpu(service: Any, pod: Mapping[str, Any]) -> bool:
    return service.request(pod).device is None  # type: ignore[no-any-return]


def _pending_from_api(pod: Mapping[str, Any], verdicts: Sequence[NodeVerdict], pod_error: str) -> PendingPod:
    from scheduler_plugin import pods as pod_objects
    from scheduler_plugin.events import summarize

    meta = pod_objects.meta(pod)
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    message = next(
        (str(c.get("message") or "") for c in conditions or [] if isinstance(c, Mapping) and c.get("type") == "PodScheduled"),
        "",
    )
    wants = pod_error and "invalid request"
    if not pod_error:
        from scheduler_plugin.core.demand import demand_of
        from scheduler_plugin.core.reasons import describe_demand

        wants = describe_demand(demand_of(pod_objects.request_of(pod, rules=None)))
    return PendingPod(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        wants=wants,
        summary=summarize(verdicts, pod_error=pod_error),
        reasons=_counted(verdicts) if not pod_error else ((pod_error, 0),),
        message=message,
    )


def _pending_from_json(entries: Sequence[Any]) -> tuple[TracePod, ...]:
    from scheduler_plugin.sim.snapshot import SnapshotError
    from scheduler_plugin.sim.trace import TracePod

    out = []
    for i, entry in enumerate(entries):
        try:
            out.append(
                TracePod(
                    name=str(entry["name"]),
                    cpu_milli=int(entry.get("cpu_milli", 0)),
                    memory_mib=int(entry.get("memory_mib", 0)),
                    num_gpu=int(entry["num_gpu"]),
                    gpu_milli=int(entry["gpu_milli"]),
                    gpu_spec=tuple(str(m) for m in entry.get("gpu_spec", [])),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SnapshotError(
                f"pending[{i}]: {exc!r}: give name, num_gpu and gpu_milli (and optionally cpu_milli, memory_mib, gpu_spec)"
            ) from None
    return tuple(out)


def _request(pod: TracePod) -> Any:
    from scheduler_plugin.sim.replay import pod_request

    return pod_request(pod)


def _pending_pod(pod: TracePod, verdicts: Sequence[NodeVerdict]) -> PendingPod:
    from scheduler_plugin.core.demand import demand_of
    from scheduler_plugin.core.reasons import describe_demand
    from scheduler_plugin.events import summarize

    namespace, name = _split(pod.name)
    return PendingPod(
        namespace=namespace,
        name=name,
        uid=pod.name,
        wants=describe_demand(demand_of(_request(pod))),
        summary=summarize(verdicts),
        reasons=_counted(verdicts),
    )


def _counted(verdicts: Sequence[NodeVerdict]) -> tuple[tuple[str, int], ...]:
    counts = Counter(v.reason or "no reason given" for v in verdicts if not v.feasible)
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _fragmentation(snapshot: Snapshot) -> tuple[Scheduler, float, dict[str, float]]:
    """A core holding `snapshot`, FGD's fragmentation (% of GPU capacity) and per node (milli-GPU)."""
    from scheduler_plugin.core.policies import DEFAULT_POLICY
    from scheduler_plugin.core.policy_fgd import FragmentationTracker
    from scheduler_plugin.sim.snapshot import scheduler_for
    from scheduler_plugin.sim.trace import MILLI_PER_GPU, TracePod
    from scheduler_plugin.sim.workload import gpu_capacity_milli, typical_shapes

    # An empty cluster has no shapes of its own: measure it against whole single GPUs.
    workload = typical_shapes([p.pod for p in snapshot.pods if p.pod.num_gpu] or [TracePod("-", 0, 0, 1, MILLI_PER_GPU)])
    core = scheduler_for(snapshot, policy=DEFAULT_POLICY, workload=workload)
    tracker = FragmentationTracker(core.state, workload)
    tracker.refresh()
    capacity = gpu_capacity_milli(snapshot.nodes) or 1
    per_node = {name: float(tracker.index.node_frag[slot]) for name, slot in core.state.slot_of.items()}
    return core, tracker.index.total() / capacity * 100, per_node


def _row(view: NodeView, *, split_names: bool) -> NodeRow:
    """A core's node view as inspect's row; a snapshot's pods are named namespace/name in one field."""

    def share(p: Any) -> PodShare:
        namespace, name = _split(p.name) if split_names and "/" in p.name else (p.namespace, p.name)
        return PodShare(namespace, name, str(p.uid), p.core_percent, p.memory_bytes, p.assumed)

    return NodeRow(
        name=view.name,
        driver_version=view.driver_version,
        discovery_error=view.discovery_error,
        gpus=tuple(
            GPURow(
                device=g.device,
                allocated_core_percent=g.allocated_core_percent,
                allocated_memory_bytes=g.allocated_memory_bytes,
                held_externally=g.held_externally,
                pods=tuple(share(p) for p in g.pods),
            )
            for g in view.gpus
        ),
    )


def _split(key: str) -> tuple[str, str]:
    namespace, sep, name = key.partition("/")
    return (namespace, name) if sep else ("trace", key)

