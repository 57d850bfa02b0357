"""`fgpu-descheduler`: the defragmentation controller's entry point (docs/defrag.md).

    fgpu-descheduler [--kubeconfig FILE] [--interval 60] [--policy fgpu] [--no-dry-run]
                     [--pending-seconds 300] [--min-fragmentation 0.25]
                     [--consolidate-every 0] [--consolidate-max-occupancy 0.25] [--consolidate-min-gpus 1]
                     [--moves-per-hour 10] [--moves-per-node-per-hour 2] [--max-moves-per-plan 4]
                     [--settle-seconds 600] [--metrics-port 9403] [--namespace NS]

Dry-run is the default: it records `DefragWouldEvict` Events and evicts nothing until started with
`--no-dry-run`; it counts those would-be moves against the same limits. It stops evicting (keeps
serving metrics) after any unexpected API answer, or when the pod it made room for is still
pending `--settle-seconds` later or is gone without having bound. The stop is recorded in the
ConfigMap `fgpu-descheduler-stopped` of `--namespace` and read back at start: delete it and restart
to resume. The last hour's moves are rebuilt at start from its Events. One replica: the Deployment
stops the old Pod before starting a new one, so no leader election is needed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter

from apis import names
from apis.metrics_server import MetricsServer
from scheduler_plugin.core.policies import policy_names
from scheduler_plugin.descheduler.controller import Controller, Settings, Stats
from scheduler_plugin.descheduler.evictor import Evictor, Limits
from scheduler_plugin.descheduler.kube import DeschedulerKube
from scheduler_plugin.descheduler.triggers import ConsolidationSettings, RoomSettings
from scheduler_plugin.errors import KubeAPIError

log = logging.getLogger("fgpu-descheduler")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fgpu-descheduler", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", default="", help="default: in-cluster, then ~/.kube/config")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between cycles (default 60)")
    parser.add_argument("--policy", default="fgpu", help="the scheduler's policy, which the simulation runs (default fgpu)")
    parser.add_argument("--no-dry-run", action="store_true", help="evict for real (default: record Events only)")
    room = parser.add_argument_group("make room for pending GPU pods")
    room.add_argument("--pending-seconds", type=float, default=300.0, help="act for GPU pods pending this long (default 300)")
    room.add_argument(
        "--min-fragmentation", type=float, default=0.25,
        help="...while at least this share (0..1) of the idle GPU is fragmented, FGD's measure (default 0.25)",
    )
    consolidate = parser.add_argument_group("consolidation mode (off by default)")
    consolidate.add_argument(
        "--consolidate-every", type=float, default=0.0, metavar="SECONDS",
        help="empty a low-occupancy node for whole-GPU pods this often (default 0: never)",
    )
    consolidate.add_argument(
        "--consolidate-max-occupancy", type=float, default=0.25, help="nodes at most this share (0..1) in use (default 0.25)"
    )
    consolidate.add_argument("--consolidate-min-gpus", type=int, default=1, help="nodes with at least this many GPUs (default 1)")
    limits = parser.add_argument_group("limits")
    limits.add_argument("--moves-per-hour", type=int, default=10, help="pods evicted per hour, cluster-wide (default 10)")
    limits.add_argument("--moves-per-node-per-hour", type=int, default=2, help="pods evicted per hour from one node (default 2)")
    limits.add_argument("--max-moves-per-plan", type=int, default=4, help="pods one plan may move (default 4)")
    limits.add_argument(
        "--settle-seconds", type=float, default=600.0,
        help="stop evicting when the pod room was made for is still pending this long after (default 600)",
    )
    parser.add_argument("--metrics-port", type=int, default=9403, help="Prometheus metrics (default 9403; 0: none)")
    parser.add_argument(
        "--namespace", default=os.environ.get(names.DESCHEDULER_NAMESPACE_ENV) or "default",
        help=f"its own namespace, where the stop is recorded (default ${names.DESCHEDULER_NAMESPACE_ENV}, else default)",
    )
    return parser


def settings_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Settings, Limits]:
    """The flags as settings, or `parser.error` naming the flag, the value and what to give."""
    for flag, value in (("--moves-per-hour", args.moves_per_hour), ("--moves-per-node-per-hour", args.moves_per_node_per_hour),
                        ("--pending-seconds", args.pending_seconds), ("--consolidate-every", args.consolidate_every)):
        if value < 0:
            parser.error(f"{flag} {value}: give 0 or more")
    for flag, value in (("--interval", args.interval), ("--settle-seconds", args.settle_seconds),
                        ("--max-moves-per-plan", args.max_moves_per_plan), ("--consolidate-min-gpus", args.consolidate_min_gpus)):
        if value <= 0:
            parser.error(f"{flag} {value}: give a positive number")
    for flag, value in (("--min-fragmentation", args.min_fragmentation), ("--consolidate-max-occupancy", args.consolidate_max_occupancy)):
        if not 0 <= value <= 1:
            parser.error(f"{flag} {value}: give a share between 0 and 1")
    if args.policy not in policy_names():
        parser.error(f"--policy {args.policy}: choose from {', '.join(policy_names())}")
    settings = Settings(
        policy=args.policy,
        room=RoomSettings(pending_s=args.pending_seconds, min_fragmentation=args.min_fragmentation),
        consolidation=ConsolidationSettings(
            every_s=args.consolidate_every, max_occupancy=args.consolidate_max_occupancy, min_gpus=args.consolidate_min_gpus
        ),
        max_moves_per_plan=args.max_moves_per_plan,
        settle_s=args.settle_seconds,
    )
    return settings, Limits(args.moves_per_hour, args.moves_per_node_per_hour, dry_run=not args.no_dry_run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings, limits = settings_from(args, parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        connected = DeschedulerKube.connect(kubeconfig=args.kubeconfig)
    except KubeAPIError as exc:
        log.error("%s", exc)
        return 2
    assert isinstance(connected, DeschedulerKube)  # Kube.connect builds `cls`
    kube = connected
    kube.state_namespace = args.namespace
    try:
        evictor = Evictor(kube, limits)
    except KubeAPIError as exc:  # without the last hour's moves and the recorded stop it must not act
        log.error("cannot read the last hour's moves or the recorded stop: %s", exc)
        kube.close()
        return 2
    registry = CollectorRegistry()

    def counter(name: str, text: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name.removesuffix("_total"), text, list(labels), registry=registry)

    moves = counter(names.METRIC_DEFRAG_MOVES, "pods evicted to make room or empty a node")
    made_room = counter(names.METRIC_DEFRAG_MADE_ROOM, "pending GPU pods room was made for")
    waited = counter(names.METRIC_DEFRAG_WAITED_GPU_SECONDS, "GPUs x seconds those pods had waited when room was made")
    emptied = counter(names.METRIC_DEFRAG_NODES_EMPTIED, "nodes the consolidation mode emptied of GPU pods")
    aborted = counter(names.METRIC_DEFRAG_ABORTED, "plans not carried out, by reason", ["reason"])
    metrics_server = None
    if args.metrics_port:  # on the pod network: a bounded server, no thread per connection (apis/metrics_server.py)
        metrics_server = MetricsServer(registry, host="", port=args.metrics_port, name="fgpu-descheduler-metrics")
        metrics_server.start()
    controller = Controller(kube, evictor, settings)
    log.info(
        "started (%s; %d moves left this hour)%s", "dry-run: Events only" if limits.dry_run else "evicting",
        evictor.moves_left(), f"; stopped: {evictor.stopped}" if evictor.stopped else "",
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set():
        stats = Stats()
        try:
            log.info("%s", controller.cycle(stats))
        except KubeAPIError as exc:
            log.warning("cycle skipped: %s", exc)
        except Exception:  # a daemon never dies of one bad cycle; it says so and stops evicting
            log.exception("cycle failed; no more evictions until restart")
            controller.evictor.stop("a cycle failed (see the log)")
        moves.inc(stats.moves)
        made_room.inc(stats.made_room)
        waited.inc(stats.waited_gpu_seconds)
        emptied.inc(stats.consolidated_nodes)
        for reason, count in stats.aborted.items():
            aborted.labels(reason=reason).inc(count)
        if controller.evictor.stopped:
            log.error(
                "evictor stopped, no more evictions until ConfigMap %s/%s is deleted and it restarts: %s",
                args.namespace, names.DESCHEDULER_STOP_CONFIGMAP, controller.evictor.stopped,
            )
        stop.wait(args.interval)
    if metrics_server is not None:
        metrics_server.stop(1.0)
    kube.close()
    return 0
