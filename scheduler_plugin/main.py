"""`fgpu-scheduler`: the command line of the scheduler service.

    fgpu-scheduler [--config FILE] [--state kubernetes|embedded] [--db FILE]
                   [--kubeconfig FILE] [--grpc-listen ADDRESS] [--extender-listen HOST:PORT]
                   [--standalone] [--signing-key FILE] [--verifying-keys PATH]
                   [--legacy-signing-key FILE] [--policy NAME]

Flags override the config file (see scheduler_plugin/config.py for its keys).
Stops cleanly on SIGTERM/SIGINT: servers drain, the lease is handed back.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from apis.signing import SignatureError
from apis.translation import RulesError
from scheduler_plugin import config as config_mod
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.config import ConfigError, SchedulerConfig
from scheduler_plugin.errors import ServiceError

log = logging.getLogger("fgpu-scheduler")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fgpu-scheduler",
        description="fgpu scheduler: picks the node and the GPUs for pods that ask for GPU shares.",
    )
    p.add_argument("--config", metavar="FILE", help="YAML config file (flags override it)")
    p.add_argument("--state", choices=[s.value for s in config_mod.StateBackend], help="state backend")
    p.add_argument("--db", metavar="FILE", help="SQLite file of the embedded state backend")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig; default: in-cluster, then ~/.kube/config")
    p.add_argument("--grpc-listen", metavar="ADDRESS", help="gRPC address, unix:///path.sock or HOST:PORT")
    p.add_argument("--extender-listen", metavar="HOST:PORT", help="kube-scheduler extender HTTP address")
    p.add_argument("--metrics-listen", metavar="HOST:PORT", help="separate Prometheus /metrics address")
    p.add_argument("--standalone", action="store_true", default=None, help="bind pods with schedulerName fgpu-scheduler")
    p.add_argument(
        "--signing-key", metavar="FILE",
        help="Ed25519 private key (PEM) allocations are signed with; re-read on change (fgpuctl keys generate)",
    )
    p.add_argument(
        "--verifying-keys", metavar="PATH",
        help="public keys (PEM file or directory) of earlier signing keys, to check pods signed before a rotation",
    )
    p.add_argument(
        "--legacy-signing-key", metavar="FILE",
        help="the v1 HMAC key, to check pods signed before the upgrade to v2 (the upgrade window only)",
    )
    p.add_argument("--policy", metavar="NAME", help="scoring policy (binpack, spread, fgd, ...)")
    p.add_argument("--gpu-policy", metavar="NAME", help="GPU-level policy; default: the same as --policy")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def resolve_config(args: argparse.Namespace) -> SchedulerConfig:
    base = config_mod.load_file(args.config) if args.config else SchedulerConfig()
    resolved = config_mod.with_overrides(
        base,
        state=args.state,
        db=args.db,
        kubeconfig=args.kubeconfig,
        grpc_listen=args.grpc_listen,
        extender_listen=args.extender_listen,
        metrics_listen=args.metrics_listen,
        standalone=args.standalone,
        signing_key=args.signing_key,
        verifying_keys=args.verifying_keys,
        legacy_signing_key=args.legacy_signing_key,
        policy=args.policy,
        gpu_policy=args.gpu_policy,
    )
    config_mod.check_policies(resolved)
    return resolved


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = resolve_config(args)
    except ConfigError as exc:
        print(f"fgpu-scheduler: {exc}", file=sys.stderr)
        return 2
    app = SchedulerApp(config)
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        done.set()
        app.interrupt_start()  # a start still waiting for the API gives up

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        app.start()
    except (ServiceError, SignatureError, RulesError, ConfigError, ValueError, OSError) as exc:
        app.stop(1.0)
        if done.is_set():
            return 0
        print(f"fgpu-scheduler: cannot start: {exc}", file=sys.stderr)
        return 1
    # Poll rather than block: a signal caught by a gRPC core thread only sets a flag, and the
    # handler runs once the main thread wakes; an untimed wait could sleep through SIGTERM.
    while not done.wait(timeout=0.5):
        pass
    app.stop(5.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
