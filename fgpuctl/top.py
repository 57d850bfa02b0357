"""`fgpuctl top`: per pod and GPU, the GPU memory its processes use now, beside what it was allocated.

    fgpuctl top [--kubeconfig FILE] [-n NAMESPACE | -A] [-o table|wide|json|yaml] [POD ...]
    fgpuctl top --metrics-url http://NODE:9400/metrics ...     # scrape these agents instead

The numbers are the agents' own (`fgpu_agent_pod_gpu_memory_used_bytes`, `..._pod_gpu_processes`,
per GPU `fgpu_agent_gpu_sm_utilization_percent` and `..._memory_total_bytes`; the agent maps each
process to its pod by cgroup, agent/usage.py). The agents are found as the pods of the agent
DaemonSets (`--agent-namespace`, labels `app.kubernetes.io/component=agent,part-of=fgpu`) and
scraped at their pod IP, which is the node's (host network), on their `metrics` port: run it where
the nodes are reachable, or port-forward an agent and give `--metrics-url`. Pod names, nodes and
allocations come from the API; a pod the API no longer has is shown by its uid. A GPU pod whose
processes hold no memory yet is listed with 0 used.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from apis import names
from apis.allocation import AllocationError, decode_allocation, share_memory_bytes
from fgpuctl import api_errors, kubecontext
from fgpuctl.text_table import printable, render

#: The agent's metric names (agent/metrics.py; tests/kubectl_plugin keeps them equal to what it exports).
POD_MEMORY = names.AGENT_METRIC_POD_GPU_MEMORY_USED
POD_PROCESSES = names.AGENT_METRIC_POD_GPU_PROCESSES
GPU_SM = names.AGENT_METRIC_GPU_SM_UTILIZATION
GPU_MEMORY_TOTAL = names.AGENT_METRIC_GPU_MEMORY_TOTAL
#: The agent pods' labels and their metrics port's name (deploy/chart/templates/30-agent.yaml).
AGENT_LABELS = {"app.kubernetes.io/component": "agent", "app.kubernetes.io/part-of": "fgpu"}
METRICS_PORT_NAME = "metrics"
DEFAULT_METRICS_PORT = 9400
SCRAPE_TIMEOUT_S = 5.0
#: What a GPU or MIG UUID looks like, as NVML writes them (GPU-<uuid>, MIG-<uuid>, MIG-GPU-<uuid>/<gi>/<ci>).
#: top reads allocations without verifying their signature, and a pod author can re-annotate a running
#: pod: an id of any other form is not shown (fgpuctl inspect says what is wrong with it).
_GPU_ID = re.compile(r"(GPU|MIG)-[A-Za-z0-9][A-Za-z0-9/_.-]{0,95}")


@dataclass(frozen=True)
class AgentUsage:
    """What one agent's /metrics says: per (pod uid, GPU uuid) memory and processes, per GPU its facts."""

    pods: Mapping[tuple[str, str], tuple[int, int]]
    gpu_sm_percent: Mapping[str, float]
    gpu_memory_total: Mapping[str, int]


@dataclass(frozen=True)
class PodGPUUse:
    """One row: a pod on one GPU."""

    namespace: str
    pod: str
    uid: str
    node: str
    gpu: str
    memory_used_bytes: int
    processes: int
    #: what the allocation gives the pod on this GPU; -1 when it names none (no allocation, or unreadable)
    memory_allocated_bytes: int
    core_allocated_percent: int
    #: the whole GPU's SM utilization (NVML does not split it by process)
    gpu_sm_percent: float


def parse_agent_metrics(text: str) -> AgentUsage:
    """The per-pod and per-GPU series of one agent's exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    pods: dict[tuple[str, str], list[int]] = {}
    sm: dict[str, float] = {}
    total: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name in (POD_MEMORY, POD_PROCESSES) and labels.get("pod_uid") and labels.get("uuid"):
                slot = pods.setdefault((labels["pod_uid"], labels["uuid"]), [0, 0])
                slot[0 if sample.name == POD_MEMORY else 1] = int(sample.value)
            elif sample.name == GPU_SM and labels.get("uuid"):
                sm[labels["uuid"]] = float(sample.value)
            elif sample.name == GPU_MEMORY_TOTAL and labels.get("uuid"):
                total[labels["uuid"]] = int(sample.value)
    return AgentUsage(pods={k: (v[0], v[1]) for k, v in pods.items()}, gpu_sm_percent=sm, gpu_memory_total=total)


def agent_urls(pods: Iterable[Mapping[str, Any]], *, namespace: str) -> dict[str, str]:
    """node -> metrics URL of the running agent pod on it."""
    found: dict[str, str] = {}
    for pod in pods:
        meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
        labels = meta.get("labels") or {}
        if meta.get("namespace") != namespace or any(labels.get(k) != v for k, v in AGENT_LABELS.items()):
            continue
        if status.get("phase") != "Running" or not status.get("podIP"):
            continue
        port = DEFAULT_METRICS_PORT
        for container in spec.get("containers") or ():
            for p in container.get("ports") or ():
                if p.get("name") == METRICS_PORT_NAME:
                    port = int(p.get("containerPort", port))
        found[str(spec.get("nodeName", ""))] = f"http://{_host(str(status['podIP']))}:{port}/metrics"
    return found


def usage_rows(usages: Sequence[AgentUsage], pods: Iterable[Mapping[str, Any]]) -> list[PodGPUUse]:
    """Every (pod, GPU) pair that an agent reports or an allocation names, sorted by namespace, pod, GPU."""
    by_uid = {str((p.get("metadata") or {}).get("uid", "")): p for p in pods}
    measured: dict[tuple[str, str], tuple[int, int]] = {}
    sm: dict[str, float] = {}
    total: dict[str, int] = {}
    for usage in usages:
        measured.update(usage.pods)
        sm.update(usage.gpu_sm_percent)
        total.update(usage.gpu_memory_total)
    allocated: dict[tuple[str, str], tuple[int, int]] = {}
    for uid, pod in by_uid.items():
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        annotation = ((pod.get("metadata") or {}).get("annotations") or {}).get(names.DEVICE_ALLOCATED)
        if not annotation:
            continue
        try:
            allocation = decode_allocation(annotation)
        except AllocationError:
            continue  # fgpuctl inspect says what is wrong with it; top only shows use
        for share in allocation.gpus:
            gpu = share.mig_uuid or share.uuid
            if not _GPU_ID.fullmatch(gpu):
                continue
            memory = share_memory_bytes(share, gpu_memory_bytes=total.get(gpu, 0))
            allocated[(uid, gpu)] = (memory, share.core_percent)
    rows = []
    for uid, gpu in set(measured) | set(allocated):
        pod = by_uid.get(uid, {})
        meta = pod.get("metadata") or {}
        used, processes = measured.get((uid, gpu), (0, 0))
        memory, core = allocated.get((uid, gpu), (-1, -1))
        rows.append(
            PodGPUUse(
                namespace=str(meta.get("namespace", "")),
                pod=str(meta.get("name", "")) or f"(uid {uid})",
                uid=uid,
                node=str((pod.get("spec") or {}).get("nodeName", "")),
                gpu=gpu,
                memory_used_bytes=used,
                processes=processes,
                memory_allocated_bytes=memory,
                core_allocated_percent=core,
                gpu_sm_percent=sm.get(gpu, 0.0),
            )
        )
    return sorted(rows, key=lambda r: (r.namespace, r.pod, r.gpu))


def table(rows: Sequence[PodGPUUse], *, wide: bool) -> str:
    header = ["NAMESPACE", "POD", "NODE", "GPU", "MEMORY(used/alloc)", "PROCESSES"]
    if wide:
        header += ["CORE(alloc)", "GPU-SM", "UID"]
    lines = [header]
    for r in rows:
        alloc = _gib(r.memory_allocated_bytes) if r.memory_allocated_bytes >= 0 else "-"
        line = [r.namespace or "-", r.pod, r.node or "-", r.gpu, f"{_gib(r.memory_used_bytes)}/{alloc}", str(r.processes)]
        if wide:
            line += [f"{r.core_allocated_percent}%" if r.core_allocated_percent >= 0 else "-", f"{r.gpu_sm_percent:g}%", r.uid]
        lines.append(line)
    return "".join(line + "\n" for line in render(lines, gap="   "))


def document(rows: Sequence[PodGPUUse]) -> dict[str, Any]:
    """-o json / yaml: {"pods": [{"namespace", "pod", "uid", "node", "gpu", "memory_used_bytes", "processes",
    "memory_allocated_bytes" (-1: none), "core_allocated_percent" (-1: none), "gpu_sm_percent"}]}"""
    return {"pods": [asdict(r) for r in rows]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE", default="", help="the cluster (default: in-cluster, then ~/.kube/config)")
    kubecontext.add_flag(parser)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", default="", help="only pods of this namespace")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="pods of every namespace (the default)")
    parser.add_argument("--agent-namespace", default="fgpu-system", help="where the agent DaemonSets run (default fgpu-system)")
    parser.add_argument(
        "--metrics-url", action="append", default=[], metavar="URL",
        help="scrape this agent metrics URL instead of finding the agents (repeatable)",
    )
    parser.add_argument("-o", "--output", choices=["table", "wide", "json", "yaml"], default="table")
    parser.add_argument("pods", nargs="*", help="only these pods (names)")


def run(args: argparse.Namespace) -> int:
    from scheduler_plugin.kube import Kube

    try:
        kube = Kube.connect(kubeconfig=args.kubeconfig)
        try:
            pods = kube.list_pods().items
        finally:
            kube.close()
    except Exception as exc:  # an unreachable or refusing API server: one line, not a traceback
        print(f"fgpuctl top: {api_errors.explain(exc)}", file=sys.stderr)
        return 1
    urls = list(args.metrics_url) or sorted(agent_urls(pods, namespace=args.agent_namespace).values())
    if not urls:
        print(
            f"fgpuctl top: no running fgpu-agent pod in namespace {args.agent_namespace} "
            "(give --agent-namespace, or --metrics-url)", file=sys.stderr,
        )
        return 1
    usages, failures = _scrape_all(urls)
    for line in failures:
        print(f"fgpuctl top: warning: {line}", file=sys.stderr)
    if not usages:
        return 1
    rows = [
        r for r in usage_rows(usages, pods)
        if (not args.namespace or r.namespace == args.namespace) and (not args.pods or r.pod in args.pods)
    ]
    if args.output in ("json", "yaml"):
        print(dump(document(rows), args.output), end="")
    else:
        print(table(rows, wide=args.output == "wide"), end="")
    found = {r.pod for r in rows}
    missing = [name for name in dict.fromkeys(args.pods) if name not in found]
    if missing:  # as `kubectl top pod a b`: a pod asked for by name and not shown is an error
        where = f"namespace {args.namespace}" if args.namespace else "any namespace"
        print(
            f"fgpuctl top: no GPU pod {', '.join(map(printable, missing))} in {where} (no such pod, it holds no GPU, "
            "or its node's agent could not be scraped)", file=sys.stderr,
        )
        return 1
    return 0


def dump(doc: object, output: str) -> str:
    """A document as -o json or -o yaml prints it (kubectl's layout: JSON indented by 4, block YAML)."""
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return json.dumps(doc, indent=4) + "\n"


def _scrape_all(urls: Sequence[str]) -> tuple[list[AgentUsage], list[str]]:
    def one(url: str) -> AgentUsage | str:
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                return parse_agent_metrics(response.read().decode())
        except (OSError, ValueError) as exc:  # unreachable, refused, not exposition text
            return f"{url}: cannot scrape: {exc}"

    with ThreadPoolExecutor(max_workers=min(32, len(urls))) as pool:
        results = list(pool.map(one, urls))
    return [r for r in results if isinstance(r, AgentUsage)], [r for r in results if isinstance(r, str)]


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f}Gi"
