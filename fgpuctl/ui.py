"""`fgpuctl ui`: a read-only web view of the cluster's GPUs (docs/webview.md).

    fgpuctl ui --snapshot FILE | --scheduler ADDRESS | --kubeconfig FILE [--listen 127.0.0.1:9447]

The page is at `/`, its data at `/cluster.json` (`ui_model.py` gives the shape). It listens at once
and gathers in the background: the views every `--interval` seconds, the defrag plan (the costly
part) every `--defrag-interval` seconds within `--defrag-budget` seconds. It listens on
loopback by default, as the scheduler's listeners do; beyond loopback only with mutual TLS
(`--tls-cert`, `--tls-key`, `--tls-client-ca`). From a workstation, `kubectl port-forward` to the
scheduler and run `fgpuctl ui --scheduler 127.0.0.1:9090` locally, or use `--kubeconfig`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from fgpuctl import kubecontext

DEFAULT_LISTEN = "127.0.0.1:9447"
_TLS_FLAGS = ("--tls-cert", "--tls-key", "--tls-client-ca")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--snapshot", metavar="FILE", help="a cluster snapshot file (as fgpuctl defrag-plan reads)")
    source.add_argument("--scheduler", metavar="ADDRESS", help="ask a running fgpu-scheduler (unix:///path.sock or HOST:PORT)")
    source.add_argument("--kubeconfig", metavar="FILE", help="read Devices, Nodes, pods and budgets from this cluster "
                        "(default, with none of the three: in-cluster, then $KUBECONFIG or ~/.kube/config)")
    kubecontext.add_flag(parser)
    parser.add_argument("--listen", metavar="HOST:PORT", default=DEFAULT_LISTEN,
                        help=f"where to serve the view (default {DEFAULT_LISTEN}; no host means 127.0.0.1; "
                        "beyond loopback only with mutual TLS)")
    parser.add_argument("--tls-cert", metavar="FILE", default="", help="HTTPS certificate (with --tls-key, --tls-client-ca)")
    parser.add_argument("--tls-key", metavar="FILE", default="", help="HTTPS private key")
    parser.add_argument("--tls-client-ca", metavar="FILE", default="", help="CA that must sign the browsers' client certificates")
    parser.add_argument("--interval", type=float, default=30.0, metavar="SECONDS",
                        help="seconds between samples of nodes, pods and pending reasons (default 30)")
    parser.add_argument("--defrag-interval", type=float, default=300.0, metavar="SECONDS",
                        help="seconds between defrag plans, made on the latest sample (default 300; 0 turns plans off)")
    parser.add_argument("--defrag-budget", type=float, default=60.0, metavar="SECONDS",
                        help="most seconds one defrag plan may take; past it the plan is stopped and the page says so (default 60)")
    parser.add_argument("--history-hours", type=float, default=6.0, help="how long the history chart reaches back (default 6)")
    parser.add_argument("--defrag-gpus", type=int, default=1, help="GPUs per pod of the shape the defrag plan makes room for (default 1)")
    parser.add_argument("--defrag-gpu-milli", type=int, default=1000, help="per-GPU share of that shape in 1/1000 GPU (default 1000)")
    parser.add_argument("--max-moves", type=int, default=10, help="most pods the defrag plan moves (default 10)")


def _fail(message: str) -> int:
    print(f"fgpuctl ui: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from apis import tls
    from fgpuctl import ui_plan, ui_server, ui_sources

    if not 1 <= args.defrag_gpus <= 64:
        return _fail(f"--defrag-gpus {args.defrag_gpus}: give 1..64 GPUs")
    if not 10 <= args.defrag_gpu_milli <= 1000 or args.defrag_gpu_milli % 10 or (args.defrag_gpus > 1 and args.defrag_gpu_milli != 1000):
        return _fail(f"--defrag-gpu-milli {args.defrag_gpu_milli}: give 10..1000 in steps of 10 (1000 when --defrag-gpus > 1)")
    if args.interval < 1 or args.history_hours <= 0:
        return _fail(f"--interval {args.interval} / --history-hours {args.history_hours}: give at least 1 second and more than 0 hours")
    if args.defrag_interval and args.defrag_interval < 1:
        return _fail(f"--defrag-interval {args.defrag_interval}: give at least 1 second, or 0 to turn plans off")
    if not 0 < args.defrag_budget <= 3600:
        return _fail(f"--defrag-budget {args.defrag_budget}: give more than 0 and at most 3600 seconds")
    files = tls.TLSFiles(cert_file=args.tls_cert, key_file=args.tls_key, ca_file=args.tls_client_ca)
    try:
        host, port = tls.split_hostport(args.listen, field="--listen", example=DEFAULT_LISTEN)
        tls.check_complete(files, field="--listen", keys=_TLS_FLAGS)
        # Host-less means loopback here, as for the scheduler's HTTP listeners.
        host = host or "127.0.0.1"
        tls.check_listener(f"{host}:{port}", files, field="--listen", tls_key="/".join(_TLS_FLAGS))
        context = tls.server_ssl_context(files, field="--listen") if files.enabled else None
    except tls.TLSError as exc:
        return _fail(str(exc))
    shape = ui_plan.DefragShape(gpus=args.defrag_gpus, gpu_milli=args.defrag_gpu_milli, max_moves=args.max_moves)
    if args.snapshot:
        collect, source = ui_sources.from_snapshot_file(args.snapshot), ui_sources.label("snapshot", args.snapshot)
    elif args.scheduler:
        collect, source = ui_sources.from_scheduler(args.scheduler), ui_sources.label("scheduler", args.scheduler)
    else:
        shown = kubecontext.shown(args).removeprefix("--")
        collect, source = ui_sources.from_api(args.kubeconfig or ""), ui_sources.label(*shown.split("=", 1))
    planner = ui_plan.PlanRunner(shape, budget_s=args.defrag_budget) if args.defrag_interval else None
    state = ui_server.ViewState(collect, interval_s=args.interval, history_s=args.history_hours * 3600, source=source,
                                planner=planner, plan_interval_s=args.defrag_interval)
    done = threading.Event()
    failed: list[str] = []

    def first_failure(message: str) -> None:  # a source that can't be read at all fails the command
        failed.append(message)
        done.set()

    try:
        server = ui_server.UIServer(state, host=host, port=port, ssl_context=context, on_first_failure=first_failure)
    except OSError as exc:
        return _fail(f"--listen={args.listen}: {exc.strerror or exc}")
    server.start()
    bound_host, bound_port = server.address
    scheme = "https" if context else "http"
    print(f"fgpuctl ui: serving {scheme}://{bound_host}:{bound_port}/ (data at /cluster.json; gathering the cluster's "
          "state in the background); Ctrl-C stops", flush=True)

    def stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop(2.0)
    if failed:
        print(f"fgpuctl ui: {failed[0]}", file=sys.stderr)
        return 1
    return 0
