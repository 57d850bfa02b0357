"""`fgpuctl defrag-plan`: propose pod moves that let more pods of a pending shape fit. Evicts nothing.

    fgpuctl defrag-plan --snapshot SNAPSHOT.json --gpus 8 [--gpu-milli 1000] [--cpu 8000] [--memory-mib 0]
                        [--model G2 ...] [--max-moves 10] [--policy fgpu] [-o text|json|yaml]
    fgpuctl defrag-plan --nodes NODES.csv --pods PODS.csv --seed 42 --arrived 100 --gpus 1 ...
    fgpuctl defrag-plan --kubeconfig FILE --gpus 1 ...        # a live cluster, from the API
    fgpuctl defrag-plan --scheduler ADDRESS --gpus 1 ...      # a live cluster, from the scheduler

The cluster comes from a snapshot file (nodes, placed pods and their GPUs, disruption budgets;
see scheduler_plugin/sim/snapshot.py), from a trace replay stopped at `--arrived` % (a
simulator snapshot), or from a live cluster read as `fgpuctl inspect` reads it (the API with its
PodDisruptionBudgets, or a running scheduler; see fgpuctl/live_snapshot.py); `--write-snapshot`
saves what it planned on. The moves come from the planner fgpu-descheduler and the churn
replay use (scheduler_plugin/core/defrag_planner.py, docs/defrag.md), one spot at a time. The plan
respects the budgets and the move budget, shows fragmentation and free whole GPUs / 8-GPU nodes before and after, and lists only
moves the scheduler core itself would place (GPU model, CPU/memory, the moved pod's node selector
and required node affinity against the node labels). A node short of CPU or memory for the
pending shape is cleared too, CPU-only pods included.

Exit status: 0 with a plan (also an empty one), 1 when the live cluster could not be read (as
`inspect`, `top` and `mig` exit), 2 for a wrong flag or an unreadable input file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fgpuctl.live_snapshot import LiveSnapshot
    from scheduler_plugin.sim.defrag import Plan
    from scheduler_plugin.sim.trace import TracePod


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_argument_group("cluster (a snapshot, a trace replay, or a live cluster)")
    source.add_argument("--snapshot", help="snapshot JSON: nodes, pods with their node and GPUs, budgets")
    source.add_argument(
        "--kubeconfig", metavar="FILE", help="read Devices, Nodes, pods and PodDisruptionBudgets from this cluster"
    )
    source.add_argument(
        "--scheduler", metavar="ADDRESS", help="ask a running fgpu-scheduler (unix:///path.sock or HOST:PORT)"
    )
    source.add_argument(
        "--context", metavar="NAME", default="",
        help="with the API as source: the kubeconfig context, as kubectl's --context (alone: from the default kubeconfig)",
    )
    source.add_argument("--nodes", help="trace node list CSV (with --pods)")
    source.add_argument("--pods", help="trace pod list CSV (with --nodes)")
    source.add_argument("--seed", type=int, default=42, help="replay seed (default 42)")
    source.add_argument("--arrived", type=float, default=100.0, help="stop the replay at this arrived %% (default 100)")
    source.add_argument("--replay-policy", default="fgpu", help="policy of the replay that builds the snapshot")
    source.add_argument("--write-snapshot", metavar="JSON", help="save the cluster it planned on")
    shape = parser.add_argument_group("pending pod shape")
    shape.add_argument("--gpus", type=int, default=1, help="GPUs per pod (default 1)")
    shape.add_argument("--gpu-milli", type=int, default=1000, help="per-GPU share in 1/1000 GPU (default 1000: whole)")
    shape.add_argument("--cpu", type=int, default=0, help="CPU milli (default 0)")
    shape.add_argument("--memory-mib", type=int, default=0, help="host memory MiB (default 0)")
    shape.add_argument("--model", action="append", default=[], help="allowed GPU model (repeatable; default any)")
    parser.add_argument("--max-moves", type=int, default=10, help="most pods to move (default 10)")
    parser.add_argument("--policy", default="fgpu", help="policy that places the moved pods (default fgpu)")
    parser.add_argument(
        "-o", "--output", choices=["text", "json", "yaml"], default="text",
        help="text (default), or the plan as one JSON or YAML document",
    )
    parser.add_argument("--json", action="store_true", help="the same as -o json")


#: A flag or input file that is wrong (argparse's own status for usage errors).
EXIT_USAGE = 2
#: The cluster could not be read (API or scheduler down or refusing), as inspect, top and mig exit.
EXIT_UNAVAILABLE = 1


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"fgpuctl defrag-plan: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from scheduler_plugin.core.policies import policy_names
    from scheduler_plugin.sim.defrag import plan_defrag
    from scheduler_plugin.sim.snapshot import (
        SnapshotError,
        load_snapshot,
        snapshot_from_replay,
        snapshot_to_json,
    )
    from scheduler_plugin.sim.trace import TraceError, TracePod, read_nodes, read_pods

    if args.json and args.output not in ("text", "json"):
        return _fail(f"--json and -o {args.output}: give one output format")
    for policy in (args.policy, args.replay_policy):
        if policy not in policy_names():
            return _fail(f"unknown policy {policy}; choose from {', '.join(policy_names())}")
    if not 1 <= args.gpus <= 64:
        return _fail(f"--gpus {args.gpus}: give 1..64 GPUs")
    if not 10 <= args.gpu_milli <= 1000 or args.gpu_milli % 10 or (args.gpus > 1 and args.gpu_milli != 1000):
        return _fail(f"--gpu-milli {args.gpu_milli}: give 10..1000 in steps of 10 (1000 when --gpus > 1)")
    if args.max_moves < 0:
        return _fail(f"--max-moves {args.max_moves}: give 0 or more")
    given = [f for f, v in (("--snapshot", args.snapshot), ("--kubeconfig", args.kubeconfig),
                            ("--scheduler", args.scheduler), ("--nodes", args.nodes or args.pods)) if v]
    if len(given) > 1:
        return _fail(f"{' and '.join(given)}: give one cluster source")
    notes: tuple[str, ...] = ()
    try:
        if args.kubeconfig or args.scheduler:
            live = _live(args)
            if isinstance(live, str):
                return _fail(live, EXIT_UNAVAILABLE)
            snapshot, notes = live.snapshot, live.notes
        elif args.snapshot:
            snapshot = load_snapshot(args.snapshot)
        elif args.nodes and args.pods:
            snapshot = snapshot_from_replay(
                nodes=read_nodes(args.nodes),
                pods=read_pods(args.pods),
                policy=args.replay_policy,
                seed=args.seed,
                arrived_pct=args.arrived,
            )
        else:
            return _fail(
                "give --snapshot FILE, --kubeconfig FILE or --scheduler ADDRESS, "
                "or --nodes and --pods to plan on a trace replay"
            )
    except (SnapshotError, TraceError) as error:
        return _fail(str(error))
    if args.write_snapshot:
        try:
            Path(args.write_snapshot).write_text(json.dumps(snapshot_to_json(snapshot)) + "\n")
        except OSError as error:
            return _fail(f"--write-snapshot={args.write_snapshot}: cannot write: {error.strerror or error}; give a path in a directory you can write to")
    pending = TracePod(
        name="pending",
        cpu_milli=args.cpu,
        memory_mib=args.memory_mib,
        num_gpu=args.gpus,
        gpu_milli=args.gpu_milli,
        gpu_spec=tuple(sorted(set(args.model))),
    )
    plan = plan_defrag(snapshot, pending=pending, max_moves=args.max_moves, policy=args.policy)
    output = "json" if args.json else args.output
    if output == "json":
        print(json.dumps(plan_document(pending, plan, notes)))
        return 0
    if output == "yaml":
        import yaml

        print(yaml.safe_dump(plan_document(pending, plan, notes), sort_keys=False, default_flow_style=False), end="")
        return 0
    for note in notes:
        print(f"note: {note}")
    shape = f"{pending.num_gpu} x {pending.gpu_milli / 1000:g} GPU, {pending.cpu_milli}m CPU, {pending.memory_mib} MiB"
    print(f"pending shape: {shape}")
    print(f"{'':18}{'before':>10}{'after':>10}")
    for label, key in (
        ("pending pods fit", "pending_fit"),
        ("free whole GPUs", "free_whole_gpus"),
        ("free 8-GPU nodes", "free_8gpu_nodes"),
        ("fragmentation %", "frag_pct"),
    ):
        print(f"{label:18}{getattr(plan.before, key):>10}{getattr(plan.after, key):>10}")
    if not plan.moves:
        print(
            "no move helps within the budget (nothing to do, or every blocking pod is pinned, "
            "or fits nowhere else its model, node selector and affinity allow)"
        )
    for number, move in enumerate(plan.moves, start=1):
        print(f"{number:3}. move {move.pod}: {move.from_node} -> {move.to_node} (GPU {','.join(map(str, move.gpus)) or '-'})")
    for line in plan.skipped[:5]:
        print(f"skipped {line}")
    if len(plan.skipped) > 5:
        print(f"skipped {len(plan.skipped) - 5} more node(s) (all of them in -o json)")
    return 0


def _live(args: argparse.Namespace) -> LiveSnapshot | str:
    """The live cluster's snapshot, or the one-line reason it could not be read."""
    import grpc

    from fgpuctl import api_errors, kubecontext
    from fgpuctl.cluster_state import from_scheduler, read_api
    from fgpuctl.live_snapshot import LiveStateError, snapshot_from_api, snapshot_from_scheduler

    try:
        if args.scheduler:
            return snapshot_from_scheduler(from_scheduler(args.scheduler, ()))
        return snapshot_from_api(read_api(args.kubeconfig, (), budgets=True))
    except grpc.RpcError as exc:
        return f"--scheduler={args.scheduler}: {exc.code().name}: {exc.details()}"
    except LiveStateError as exc:
        return str(exc)
    except Exception as exc:  # an unreachable or refusing API server: one line for the operator, not a traceback
        message = api_errors.explain(exc)
        if message.startswith(("--kubeconfig", "no --kubeconfig")):  # a kubeconfig that cannot be loaded says so
            return message
        return f"{kubecontext.shown(args)}: {message}"


def plan_document(pending: TracePod, plan: Plan, notes: Sequence[str]) -> dict[str, Any]:
    """`fgpuctl defrag-plan --json`'s document; the web view shows the same."""
    return {
        "pending": {"gpus": pending.num_gpu, "gpu_milli": pending.gpu_milli, "cpu_milli": pending.cpu_milli,
                    "memory_mib": pending.memory_mib, "models": list(pending.gpu_spec)},
        "moves": [{"pod": m.pod, "from": m.from_node, "to": m.to_node, "gpus": list(m.gpus)} for m in plan.moves],
        "opened": list(plan.opened),
        "before": vars(plan.before),
        "after": vars(plan.after),
        "skipped": list(plan.skipped),
        "notes": list(notes),
    }
