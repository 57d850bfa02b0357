"""`fgpuctl inspect`: per node and GPU, model, health, allocated/total core and memory, and the pods.

The same idea as `kubectl inspect gpushare`. Two sources give the same answer:

    fgpuctl inspect [--kubeconfig FILE]     # Devices + pod annotations from the API, rebuilt here
    fgpuctl inspect --scheduler ADDRESS     # the running scheduler's own view (GetNodeState)

`-o json` prints one JSON document (the shape of `report_json`'s docstring), `-o yaml` the same as
YAML; `-o wide` is the table.

With `--verifying-keys`, inspect from the API checks every bound pod's
allocation signature, counts one that does not verify as the scheduler does
(its request on the GPUs it names, within what is free; a fresh process knows
no earlier verified state), marks such pods `unverified` and lists them with
the reason. Without keys nothing is checked ("unverifiedAllocations": null).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from apis import names
from fgpuctl import api_errors, kubecontext
from fgpuctl.cluster_state import NodeRow, UnverifiedRow, from_scheduler, read_api
from fgpuctl.text_table import printable, render

if TYPE_CHECKING:
    from scheduler_plugin.boundpods import Verifier


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--kubeconfig", metavar="FILE", default="", help="read Devices and pods from this cluster")
    source.add_argument("--scheduler", metavar="ADDRESS", help="ask a running fgpu-scheduler (unix:///path.sock or HOST:PORT)")
    kubecontext.add_flag(parser)
    parser.add_argument(
        "--verifying-keys",
        metavar="PATH",
        default="",
        help="with the API as source: check allocation signatures with these public keys (a PEM file or a "
        "directory, as the agents' verifyingKeys) and list the pods whose allocation does not verify",
    )
    parser.add_argument(
        "--legacy-signing-key", metavar="FILE", default="", help="with --verifying-keys: also accept v1 (HMAC) signatures of this key"
    )
    parser.add_argument(
        "-o", "--output", choices=["table", "wide", "json", "yaml"], default="table",
        help="table (wide: the same, as kubectl's flag), or the report as JSON or YAML",
    )
    parser.add_argument("nodes", nargs="*", help="only these nodes")


#: The Node condition fgpu-agent writes (agent/backendcheck.py CONDITION_TYPE; tests keep the two equal).
ISOLATION_CONDITION = names.ISOLATION_READY_CONDITION


def run(args: argparse.Namespace) -> int:
    unverified: tuple[UnverifiedRow, ...] | None = None
    isolation: dict[str, dict[str, Any]] = {}
    known: Collection[str] | None = None  # every Node's name, where the source says
    try:
        if args.scheduler:
            if args.verifying_keys:
                print("fgpuctl inspect: --verifying-keys reads pods from the API; drop --scheduler", file=sys.stderr)
                return 2
            rows = from_scheduler(args.scheduler, args.nodes)
        else:
            state = read_api(args.kubeconfig, args.nodes, verify=_verifier(args.verifying_keys, legacy=args.legacy_signing_key))
            rows, unverified, known = list(state.rows), state.unverified, state.nodes.keys()
            isolation = _isolation_conditions(args.kubeconfig)
    except grpc.RpcError as exc:
        print(f"fgpuctl inspect: --scheduler={args.scheduler}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    except Exception as exc:  # reported to the operator as one line, not a traceback
        print(f"fgpuctl inspect: {api_errors.explain(exc)}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(report_json(rows, unverified, isolation), indent=2, sort_keys=True))
    elif args.output == "yaml":
        import yaml

        print(yaml.safe_dump(report_json(rows, unverified, isolation), sort_keys=True, default_flow_style=False), end="")
    else:
        print(table(rows, unverified, isolation), end="")
    missing = _missing(args.nodes, rows, known, scheduler=bool(args.scheduler))
    if missing:  # as `kubectl get node a b`: what was found is shown, what was not is an error
        print(f"fgpuctl inspect: {missing}", file=sys.stderr)
        return 1
    return 0


def _missing(asked: Sequence[str], rows: Sequence[NodeRow], known: Collection[str] | None, *, scheduler: bool) -> str:
    """One line naming each node asked for that the report lacks, and why; empty when none is missing."""
    shown = {r.name for r in rows}
    reasons = []
    for name in dict.fromkeys(n for n in asked if n not in shown):
        if scheduler:
            reasons.append(f"node {printable(name)} not found by the scheduler (no such node, or its agent reports no Device)")
        elif known is not None and name not in known:
            reasons.append(f"node {printable(name)} not found (`kubectl get nodes` lists them)")
        else:
            reasons.append(
                f"node {printable(name)} has no fgpu Device: it has no GPUs, or fgpu-agent does not run there "
                "(`kubectl -n fgpu-system get pods -o wide` lists the agents)"
            )
    return "; ".join(reasons)


def _isolation_conditions(kubeconfig: str) -> dict[str, dict[str, Any]]:
    """Per node, what its agent says of its isolation backend (the Node condition); nodes without one are left out."""
    from scheduler_plugin.kube import Kube

    kube = Kube.connect(kubeconfig=kubeconfig)
    try:
        nodes = kube.list_nodes().items
    finally:
        kube.close()
    found: dict[str, dict[str, Any]] = {}
    for node in nodes:
        for condition in (node.get("status") or {}).get("conditions") or []:
            if isinstance(condition, dict) and condition.get("type") == ISOLATION_CONDITION:
                found[str((node.get("metadata") or {}).get("name", ""))] = {
                    "ready": condition.get("status") == "True",
                    "reason": str(condition.get("reason") or ""),
                    "message": str(condition.get("message") or ""),
                }
    return found


def _verifier(path: str, *, legacy: str) -> Verifier | None:
    """A verifier with the public keys at `path` (and the v1 key at `legacy`); None without a path."""
    if not path:
        return None
    import functools

    from apis.keyfiles import load_verifying_keys
    from apis.signing import verify_pod_annotations

    return functools.partial(verify_pod_annotations, load_verifying_keys(path, legacy_key=legacy))


def report_json(
    rows: Sequence[NodeRow],
    unverified: Sequence[UnverifiedRow] | None = None,
    isolation: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """{"nodes": [{"name", "driverVersion", "discoveryError", "isolation": null (not reported) | {"ready",
    "reason", "message"} (the agent's FgpuIsolationReady condition), "gpus": [{"index", "minor", "uuid", "model",
    "healthy", "healthReason", "core": {"allocated", "total"}, "memory": {"allocatedBytes", "totalBytes"},
    "heldExternally", "pods": [{"namespace", "name", "uid", "corePercent", "memoryBytes", "assumed",
    "unverified"}]}]}], "total": {"core": {"allocated", "total"}, "memory": {"allocatedBytes", "totalBytes"}},
    "unverifiedAllocations": null (not checked) | [{"namespace", "name", "uid", "node", "problem", "countedAs",
    "counted": {"corePercent", "memoryBytes"}, "message"}]}"""
    suspect = {u.uid for u in unverified or ()}
    nodes = []
    core_alloc = core_total = mem_alloc = mem_total = 0
    for node in sorted(rows, key=lambda r: r.name):
        gpus = []
        for g in sorted(node.gpus, key=lambda g: g.device.index):
            d = g.device
            total_core = 100 if d.healthy else 0
            core_alloc += g.allocated_core_percent
            core_total += total_core
            mem_alloc += g.allocated_memory_bytes
            mem_total += d.memory_bytes if d.healthy else 0
            gpus.append(
                {
                    "index": d.index,
                    "minor": d.minor,
                    "uuid": d.uuid,
                    "model": g.model,
                    "healthy": d.healthy,
                    "healthReason": d.health_reason,
                    "core": {"allocated": g.allocated_core_percent, "total": 100},
                    "memory": {"allocatedBytes": g.allocated_memory_bytes, "totalBytes": d.memory_bytes},
                    "heldExternally": g.held_externally,
                    "pods": [
                        {
                            "namespace": p.namespace,
                            "name": p.name,
                            "uid": p.uid,
                            "corePercent": p.core_percent,
                            "memoryBytes": p.memory_bytes,
                            "assumed": p.assumed,
                            "unverified": p.uid in suspect,
                        }
                        for p in sorted(g.pods, key=lambda p: (p.namespace, p.name))
                    ],
                }
            )
        nodes.append(
            {
                "name": node.name,
                "driverVersion": node.driver_version,
                "discoveryError": node.discovery_error,
                "isolation": dict((isolation or {})[node.name]) if node.name in (isolation or {}) else None,
                "gpus": gpus,
            }
        )
    return {
        "nodes": nodes,
        "total": {
            "core": {"allocated": core_alloc, "total": core_total},
            "memory": {"allocatedBytes": mem_alloc, "totalBytes": mem_total},
        },
        "unverifiedAllocations": None
        if unverified is None
        else [
            {
                "namespace": u.namespace,
                "name": u.name,
                "uid": u.uid,
                "node": u.node,
                "problem": u.problem,
                "countedAs": u.counted_as,
                "counted": {"corePercent": u.core_percent, "memoryBytes": u.memory_bytes},
                "message": u.message,
            }
            for u in sorted(unverified, key=lambda u: (u.node, u.namespace, u.name))
        ],
    }


def table(
    rows: Sequence[NodeRow],
    unverified: Sequence[UnverifiedRow] | None = None,
    isolation: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    report = report_json(rows, unverified, isolation)
    header = ("NODE", "GPU", "MODEL", "HEALTH", "CORE(alloc/total)", "MEMORY(alloc/total)", "PODS")
    lines: list[tuple[str, ...]] = [header]
    for node in report["nodes"]:
        if not node["gpus"]:
            lines.append((node["name"], "-", "-", node["discoveryError"] or "no GPUs", "-", "-", ""))
        for g in node["gpus"]:
            health = "healthy" if g["healthy"] else f"unhealthy({g['healthReason'] or '?'})"
            if g["heldExternally"]:
                health += ",external"
            pods = ", ".join(
                f"{p['namespace']}/{p['name']}({p['corePercent']}%,{_gib(p['memoryBytes'])}"
                f"{',assumed' if p['assumed'] else ''}{',unverified' if p['unverified'] else ''})"
                for p in g["pods"]
            )
            lines.append(
                (
                    node["name"],
                    str(g["index"]),
                    g["model"],
                    health,
                    f"{g['core']['allocated']}/{g['core']['total']}",
                    f"{_gib(g['memory']['allocatedBytes'])}/{_gib(g['memory']['totalBytes'])}",
                    pods,
                )
            )
    out = render(lines, free_last=True)
    total = report["total"]
    out.append("")
    out.append(
        f"Allocated/Total GPU core in cluster: {total['core']['allocated']}/{total['core']['total']} "
        f"({_percent(total['core']['allocated'], total['core']['total'])}), memory: "
        f"{_gib(total['memory']['allocatedBytes'])}/{_gib(total['memory']['totalBytes'])} "
        f"({_percent(total['memory']['allocatedBytes'], total['memory']['totalBytes'])})"
    )
    refusing = [n for n in report["nodes"] if n["isolation"] is not None and not n["isolation"]["ready"]]
    if refusing:
        out.append("")
        out.append("Nodes that refuse GPU shares (isolation backend not ready; whole GPUs and MIG still work):")
        for n in refusing:
            out.append(printable(f"  {n['name']}: {n['isolation']['reason']}: {n['isolation']['message']}"))
    if report["unverifiedAllocations"]:
        out.append("")
        out.append("Allocations that do not verify (counted conservatively, not as written):")
        for u in report["unverifiedAllocations"]:
            counted = u["counted"]
            out.append(
                printable(
                    f"  {u['namespace']}/{u['name']} on {u['node']}: counted as {u['countedAs']} "
                    f"({counted['corePercent']}%,{_gib(counted['memoryBytes'])}): {u['problem']}"
                )
            )
    return "\n".join(out) + "\n"


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f}Gi"


def _percent(part: int, whole: int) -> str:
    return f"{100 * part // whole}%" if whole else "0%"
