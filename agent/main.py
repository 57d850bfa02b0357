"""`fgpu-agent`: the node agent's command line.

    fgpu-agent [--config FILE] [--node-name NAME] [--kubeconfig FILE] [--hook-listen unix:///PATH]
               [--isolation BACKEND] [--fake-nvml INVENTORY.yaml]
               [--verifying-keys PATH] [--legacy-signing-key FILE]
               [--scheduler ADDRESS] [--no-kubernetes] [--runtime-endpoint unix:///PATH]
               [--metrics-listen HOST:PORT]
               [--once [--print device|node]]

`--once --print device` prints the Device object the agent would write, as
JSON, and exits; `--print node` prints the node patch (labels and extended
resources). Neither needs a cluster. `--isolation` takes a registered backend's name
(agent/isolation/: hami-core, mps, none).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from agent import node_report, nvml_library
from agent.backendcheck import HostFiles
from agent.cgroups import PidResolver
from agent.checkpoint import CheckpointReader
from agent.config import AgentConfig, load_config_file, mig_record_path, resolve_node_name, with_overrides
from agent.daemon import Agent
from agent.errors import AgentError, ConfigError
from agent.fakenvml_inventory import InventoryError, load_inventory
from agent.health import HealthTracker
from agent.isolation import registry as isolation_registry
from agent.kube import Kube
from agent.metrics import AgentMetrics
from agent.mig_lifecycle import mark_created
from agent.mig_nvml import OwnedFile
from agent.node_report_writer import KubeReporter
from agent.nodestate import NodeState
from agent.nvmlapi import NVML
from agent.nvmlworker import NVMLWorker
from agent.pcitopology import InventoryTopology, PciTopologySource, SysfsTopology
from agent.schedclient import SchedulerReporter
from apis.devices import NodeDevices

log = logging.getLogger("agent")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fgpu-agent", description="fgpu node agent: GPU discovery, health, usage, reporting and the GPU runtime hook")
    p.add_argument("--config", help="YAML config file (see docs/agent.md); flags override it")
    p.add_argument("--node-name", help="Kubernetes node name (default: $NODE_NAME, then the hostname)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--no-kubernetes", action="store_true", help="do not write the Device object or the node")
    p.add_argument("--hook-listen", help="RuntimeHooks socket, e.g. unix:///var/run/fgpu-agent/hooks.sock")
    p.add_argument(
        "--isolation", choices=isolation_registry.backend_names(),
        help="isolation backend for GPU shares: "
        + "; ".join(f"{b.name}: {b.summary}" for b in isolation_registry.backends()).replace("%", "%%"),
    )
    p.add_argument("--fake-nvml", metavar="INVENTORY.yaml", help="use the fake NVML driven by this inventory")
    p.add_argument(
        "--verifying-keys", metavar="PATH",
        help="the scheduler's public keys that allocation signatures are checked with: a PEM file or a "
        "directory of them, re-read on change (default /etc/fgpu/verifying-keys)",
    )
    p.add_argument(
        "--legacy-signing-key", metavar="FILE",
        help="the v1 HMAC cluster key, to accept v1 signatures during the upgrade window only",
    )
    p.add_argument("--scheduler", help="also send ReportDevices to the scheduler service at this address")
    p.add_argument(
        "--runtime-endpoint",
        help="container runtime CRI socket, e.g. unix:///run/containerd/containerd.sock; "
        "without Kubernetes, the admission sweep and the ledger rebuild at start list its pod sandboxes",
    )
    p.add_argument("--metrics-listen", help="Prometheus endpoint HOST:PORT (empty string disables it)")
    p.add_argument("--once", action="store_true", help="discover once, report (or print) and exit")
    p.add_argument("--print", dest="print_what", choices=["device", "node"], help="with --once: print instead of writing")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    return p


def load_settings(args: argparse.Namespace) -> AgentConfig:
    base = load_config_file(args.config) if args.config else AgentConfig()
    config = with_overrides(
        base,
        node_name=args.node_name,
        kubeconfig=args.kubeconfig,
        hook_listen=args.hook_listen,
        isolation=args.isolation,
        fake_nvml=args.fake_nvml,
        verifying_keys=args.verifying_keys,
        legacy_signing_key=args.legacy_signing_key,
        scheduler=args.scheduler,
        metrics_listen=args.metrics_listen,
        runtime_endpoint=args.runtime_endpoint,
        report_to_kubernetes=False if args.no_kubernetes else None,
    )
    if args.print_what and not args.once:
        raise ConfigError("--print needs --once; run `fgpu-agent --once --print device`")
    return config


def nvml_for(config: AgentConfig) -> tuple[NVML, PciTopologySource]:
    if config.fake_nvml:
        from agent.fakenvml import FakeNVML

        inventory = load_inventory(config.fake_nvml)
        return FakeNVML(inventory), InventoryTopology(inventory)
    return nvml_library.load(), SysfsTopology(root=config.sysfs_root)


def discover_once(config: AgentConfig, *, node_name: str) -> NodeDevices:
    nvml, topology = nvml_for(config)
    metrics = AgentMetrics()
    state = NodeState(node_name=node_name, health=HealthTracker(), metrics=metrics)
    worker = NVMLWorker(
        nvml,
        state=state,
        topology=topology,
        resolver=PidResolver(proc_root=config.proc_root),
        checkpoint=CheckpointReader(config.checkpoint_path),
        external_resources=config.external_resources,
        metrics=metrics,
        watch_xids=False,
    )
    worker.run_once()
    worker.stop(0)
    return state.devices()


def node_document(devices: NodeDevices, *, advertise_nvidia_gpu: bool) -> dict[str, Any]:
    resources = node_report.node_resources(devices, advertise_nvidia_gpu=advertise_nvidia_gpu)
    return {
        "metadata": {"name": devices.node_name, "labels": node_report.node_labels(devices)},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def run_once(config: AgentConfig, *, node_name: str, print_what: str | None) -> int:
    # fgpu_created from the node's MIG record, as the daemon's reports have it: a one-shot report
    # must not offer fgpu's instances as an operator's.
    devices = mark_created(discover_once(config, node_name=node_name), OwnedFile(Path(mig_record_path(config))))
    if devices.discovery_error:
        log.error("%s", devices.discovery_error)
    if print_what == "device":
        print(json.dumps(node_report.desired_device(devices, node_uid=None), indent=2, sort_keys=True))
        return 0
    if print_what == "node":
        print(json.dumps(node_document(devices, advertise_nvidia_gpu=config.advertise_nvidia_gpu), indent=2, sort_keys=True))
        return 0
    if config.report_to_kubernetes:
        kube = Kube.connect(kubeconfig=config.kubeconfig)
        try:
            KubeReporter(kube, node_name=node_name, advertise_nvidia_gpu=config.advertise_nvidia_gpu).report(devices)
        finally:
            kube.close()
    if config.scheduler:
        sched = SchedulerReporter(config.scheduler, tls_files=config.scheduler_tls)
        try:
            sched.report(devices, (), force=True)
        finally:
            sched.close()
    return 0


def run_daemon(config: AgentConfig, *, node_name: str) -> int:
    nvml, topology = nvml_for(config)
    kube = Kube.connect(kubeconfig=config.kubeconfig) if config.report_to_kubernetes else None
    scheduler = SchedulerReporter(config.scheduler, tls_files=config.scheduler_tls) if config.scheduler else None
    # A fake-NVML node (local stacks, tests) has no GPU whose shares need enforcing: no backend check.
    files = None if config.fake_nvml else HostFiles()
    agent = Agent(
        config, node_name=node_name, nvml=nvml, topology=topology, kube=kube, scheduler=scheduler, isolation_files=files
    )
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d received", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.start()
    # Poll rather than block: a signal caught by a gRPC core thread only sets a flag, and the
    # handler runs once the main thread wakes; an untimed wait could sleep through SIGTERM.
    while not stopping.wait(timeout=0.5):
        pass
    agent.stop(5.0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = load_settings(args)
        node_name = resolve_node_name(config)
        if args.once:
            return run_once(config, node_name=node_name, print_what=args.print_what)
        return run_daemon(config, node_name=node_name)
    except (ConfigError, InventoryError) as err:
        print(f"fgpu-agent: {err}", file=sys.stderr)
        return 2
    except AgentError as err:
        print(f"fgpu-agent: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
