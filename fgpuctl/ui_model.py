"""The web view's data: one JSON document (`/cluster.json`) built from what a source gathered (pure).

The page at `/` is rendered from this document and nothing else (`ui_render.py`), so what a test
reads from `/cluster.json` is what a person sees. Before the first sample is taken the document is
only::

    {"ready": false, "source": "kubeconfig ~/.kube/config", "waitingSince": "2025-01-01T12:00:00Z",
     "error": "", "notes": [], "refresh": {...}}

(`error`: why the first sample failed, "" while it is still being taken). Once ready::

    {"ready": true, "source": "snapshot cluster.json", "generatedAt": "2025-01-01T12:00:00Z", "notes": ["..."],
     "refresh": {"intervalSeconds": 30, "lastTookSeconds": 2.1, "defragIntervalSeconds": 300, "defragBudgetSeconds": 60},
     "cluster": {"gpus": 16, "healthyGpus": 15, "allocationPercent": 41.2, "memoryPercent": 30.0,
                 "fragmentationPercent": 7.5,
                 "models": [{"model": "H100", "gpus": 8, "healthyGpus": 8, "freeGpus": 3, "sharedGpus": 2,
                             "core": {"allocated", "total"}, "memory": {"allocatedBytes", "totalBytes"}}]},
     "history": [{"t": 1735732800.0, "allocationPercent": 40.0, "memoryPercent": 29.0, "fragmentationPercent": 7.1}],
     "nodes": [... `fgpuctl inspect -o json` nodes, and per node "fragmentationMilli", "nvlinkGroups"
               ([[0, 1, 2, 3]]), per GPU "nvlinkGroup" (-1: none), "migEnabled",
               "mig": [{"profile", "slices", "memoryBytes"}] ...],
     "total": {... as `fgpuctl inspect -o json` ...},
     "pending": {"reachable": true, "note": "", "pods": [{"namespace", "name", "uid", "wants", "summary",
                 "reasons": [{"reason", "nodes"}], "message"}], "more": 0},
     "defrag": null | {"pending": {...}, "moves": [{"pod", "from", "to", "gpus"}], "opened": [...],
                       "before": {...}, "after": {...}, "skipped": [...], "notes": [...]},
     "defragStatus": {"state": "pending" | "current" | "stale" | "unavailable" | "off", "reason": "...",
                      "plannedAt": "2025-01-01T11:58:00Z" | null, "tookSeconds": 6.2 | null},
     "query": {"namespace", "pod", "model", "page", "perPage", "pages", "matchingNodes"}}

`pending.pods` holds at most `perPage` of the pods that match the query, by namespace and name;
`pending.more` counts the matching ones left out. `defrag` has the shape of `fgpuctl defrag-plan --json`. The plan is made apart from (and less often
than) the rest, on an earlier sample, so `defragStatus` says which plan is shown (`PlanState`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fgpuctl import inspect
from fgpuctl.cluster_state import NodeRow

if TYPE_CHECKING:
    from scheduler_plugin.sim.snapshot import Snapshot

JSON = dict[str, Any]

#: nodes on one page by default, and at most
PER_PAGE = 100
MAX_PER_PAGE = 2000


class QueryError(ValueError):
    """A query parameter is not usable; the message names it, its value and the fix."""


@dataclass(frozen=True)
class PendingPod:
    namespace: str
    name: str
    uid: str
    #: the pod's GPU request in the scheduler's words ("1 GPU share of 50% core and 20Gi")
    wants: str
    #: the scheduler's one-line summary ("0/3 nodes are available: 2 node(s): ...")
    summary: str
    #: distinct per-node reasons and how many nodes gave each, most frequent first
    reasons: tuple[tuple[str, int], ...]
    #: what the scheduler last wrote on the pod (its PodScheduled condition); "" when nothing
    message: str = ""


@dataclass(frozen=True)
class Pending:
    reachable: bool
    note: str = ""
    pods: tuple[PendingPod, ...] = ()


@dataclass(frozen=True)
class Planning:
    """What a defrag plan is made on: the planner's snapshot of one sample, and how it was read."""

    snapshot: Snapshot
    #: printed with the plan (`live_snapshot.LiveSnapshot.notes`)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Gathered:
    """What one sample of a source gave."""

    source: str
    rows: tuple[NodeRow, ...]
    pending: Pending
    #: FGD's fragmentation, % of GPU capacity, as the simulator measures it; None when not computed
    fragmentation_percent: float | None
    #: per node, its fragmentation in milli-GPU
    fragmentation_milli: Mapping[str, float] = field(default_factory=dict)
    #: what the defrag plan is made on; None when no plan can be made of this sample (`notes` says why)
    planning: Planning | None = None
    notes: tuple[str, ...] = ()


class PlanState(enum.Enum):
    """Which defrag plan the page shows."""

    #: none yet: the first is being made
    PENDING = "pending"
    #: the last attempt's plan
    CURRENT = "current"
    #: the last attempt failed or ran past its budget: an earlier plan is shown
    STALE = "stale"
    #: no plan to show (the reason says why)
    UNAVAILABLE = "unavailable"
    #: plans are turned off
    OFF = "off"


@dataclass(frozen=True)
class PlanStatus:
    state: PlanState
    reason: str = ""
    #: the plan shown, in `fgpuctl defrag-plan --json`'s shape
    plan: JSON | None = None
    #: when the sample it was made on was taken
    planned_at: float | None = None
    took_s: float | None = None


def plan_settled(
    previous: PlanStatus, *, plan: JSON | None, failure: str, took_s: float, sampled_at: float
) -> PlanStatus:
    """The status after an attempt that gave `plan`, or failed for `failure`: an earlier plan stays shown, marked stale."""
    if plan is not None:
        return PlanStatus(PlanState.CURRENT, plan=plan, planned_at=sampled_at, took_s=round(took_s, 3))
    if previous.plan is None:
        return PlanStatus(PlanState.UNAVAILABLE, reason=failure, took_s=round(took_s, 3))
    shown = _stamp(previous.planned_at or 0.0)
    return replace(previous, state=PlanState.STALE, reason=f"{failure}; showing the plan made on the sample of {shown}")


@dataclass(frozen=True)
class Sample:
    t: float
    allocation_percent: float
    memory_percent: float
    fragmentation_percent: float | None


@dataclass(frozen=True)
class Query:
    namespace: str = ""
    pod: str = ""
    model: str = ""
    page: int = 1
    per_page: int = PER_PAGE

    @property
    def searching(self) -> bool:
        return bool(self.namespace or self.pod or self.model)


def parse_query(params: Mapping[str, Sequence[str]]) -> Query:
    """The search and paging parameters of a request (`urllib.parse.parse_qs` form)."""

    def one(key: str) -> str:
        values = params.get(key) or [""]
        return values[-1].strip()

    def number(key: str, default: int, low: int, high: int) -> int:
        text = one(key)
        if not text:
            return default
        if text == "all" and key == "per_page":
            return high
        if not text.isdigit() or not low <= int(text) <= high:
            raise QueryError(f"{key}={text!r}: give a whole number from {low} to {high}" + (" or 'all'" if key == "per_page" else ""))
        return int(text)

    return Query(
        namespace=one("ns"),
        pod=one("pod"),
        model=one("model"),
        page=number("page", 1, 1, 1_000_000),
        per_page=number("per_page", PER_PAGE, 1, MAX_PER_PAGE),
    )


def sample_of(gathered: Gathered, *, now: float) -> Sample:
    report = inspect.report_json(gathered.rows)
    total = report["total"]
    return Sample(
        t=now,
        allocation_percent=_percent(total["core"]["allocated"], total["core"]["total"]),
        memory_percent=_percent(total["memory"]["allocatedBytes"], total["memory"]["totalBytes"]),
        fragmentation_percent=gathered.fragmentation_percent,
    )


def document(
    gathered: Gathered,
    *,
    history: Sequence[Sample],
    now: float,
    plan: PlanStatus = PlanStatus(PlanState.OFF),
    refresh: Mapping[str, Any] | None = None,
) -> JSON:
    """The whole, unfiltered document of one sample with `plan` (`with_plan` swaps in a later one)."""
    report = inspect.report_json(gathered.rows)
    by_name = {r.name: r for r in gathered.rows}
    for node in report["nodes"]:
        _add_topology(node, by_name[node["name"]], gathered.fragmentation_milli.get(node["name"]))
    total = report["total"]
    doc = {
        "ready": True,
        "source": gathered.source,
        "generatedAt": _stamp(now),
        "notes": list(gathered.notes),
        "refresh": dict(refresh or {}),
        "cluster": {
            "gpus": sum(len(n["gpus"]) for n in report["nodes"]),
            "healthyGpus": sum(1 for n in report["nodes"] for g in n["gpus"] if g["healthy"]),
            "allocationPercent": _percent(total["core"]["allocated"], total["core"]["total"]),
            "memoryPercent": _percent(total["memory"]["allocatedBytes"], total["memory"]["totalBytes"]),
            "fragmentationPercent": None
            if gathered.fragmentation_percent is None
            else round(gathered.fragmentation_percent, 2),
            "models": _models(report["nodes"]),
        },
        "history": [
            {
                "t": s.t,
                "allocationPercent": s.allocation_percent,
                "memoryPercent": s.memory_percent,
                "fragmentationPercent": s.fragmentation_percent,
            }
            for s in history
        ],
        "nodes": report["nodes"],
        "total": total,
        "pending": {
            "reachable": gathered.pending.reachable,
            "note": gathered.pending.note,
            "pods": [
                {
                    "namespace": p.namespace,
                    "name": p.name,
                    "uid": p.uid,
                    "wants": p.wants,
                    "summary": p.summary,
                    "reasons": [{"reason": r, "nodes": n} for r, n in p.reasons],
                    "message": p.message,
                }
                for p in sorted(gathered.pending.pods, key=lambda p: (p.namespace, p.name))
            ],
            "more": 0,
        },
    }
    return with_plan(doc, plan)


def with_plan(doc: JSON, plan: PlanStatus) -> JSON:
    """`doc` showing `plan` (a shallow copy: the views are not rebuilt when only the plan changes)."""
    return dict(
        doc,
        defrag=plan.plan,
        defragStatus={
            "state": plan.state.value,
            "reason": plan.reason,
            "plannedAt": None if plan.planned_at is None else _stamp(plan.planned_at),
            "tookSeconds": plan.took_s,
        },
    )


def gathering(source: str, *, since: float, error: str = "", refresh: Mapping[str, Any] | None = None) -> JSON:
    """The document before the first sample: what is being read, since when, and why it failed if it did."""
    return {"ready": False, "source": source, "waitingSince": _stamp(since), "error": error, "notes": [],
            "refresh": dict(refresh or {})}


def _add_topology(node: JSON, row: NodeRow, fragmentation_milli: float | None) -> None:
    """NVLink groups (the scheduler's own reading of the matrix) and MIG layout per GPU."""
    from scheduler_plugin.core.topology import node_topology

    gpus = sorted(row.gpus, key=lambda g: g.device.index)
    groups = node_topology([g.device for g in gpus]).nvlink if gpus else ()
    members: dict[int, list[int]] = {}
    for gpu_json, gpu, group in zip(node["gpus"], gpus, groups, strict=True):
        gpu_json["nvlinkGroup"] = group
        if group >= 0:
            members.setdefault(group, []).append(gpu.device.index)
        gpu_json["migEnabled"] = gpu.device.mig_enabled
        gpu_json["mig"] = [
            {"profile": m.profile, "slices": m.slices, "memoryBytes": m.memory_bytes}
            for m in sorted(gpu.device.mig_instances, key=lambda m: m.index)
        ]
    node["nvlinkGroups"] = [members[k] for k in sorted(members)]
    node["fragmentationMilli"] = None if fragmentation_milli is None else round(fragmentation_milli, 1)


def _models(nodes: Sequence[JSON]) -> list[JSON]:
    out: dict[str, JSON] = {}
    for node in nodes:
        for g in node["gpus"]:
            m = out.setdefault(
                g["model"],
                {
                    "model": g["model"],
                    "gpus": 0,
                    "healthyGpus": 0,
                    "freeGpus": 0,
                    "sharedGpus": 0,
                    "core": {"allocated": 0, "total": 0},
                    "memory": {"allocatedBytes": 0, "totalBytes": 0},
                },
            )
            m["gpus"] += 1
            if not g["healthy"]:
                continue
            m["healthyGpus"] += 1
            m["freeGpus"] += not g["pods"] and not g["heldExternally"]
            m["sharedGpus"] += len(g["pods"]) > 1
            m["core"]["allocated"] += g["core"]["allocated"]
            m["core"]["total"] += g["core"]["total"]
            m["memory"]["allocatedBytes"] += g["memory"]["allocatedBytes"]
            m["memory"]["totalBytes"] += g["memory"]["totalBytes"]
    return [out[k] for k in sorted(out)]


def filtered(doc: JSON, query: Query) -> JSON:
    """The document narrowed to `query` (substring matches, any case), cut to one page of nodes and
    at most a page's worth of pending pods (`pending.more` counts the rest).

    A node is kept when one of its GPUs is of a matching model and, when a namespace or pod is
    asked for, holds a matching pod; pending pods and defrag moves are narrowed by namespace and pod.
    """
    if not doc["ready"]:
        return dict(doc, query={"namespace": query.namespace, "pod": query.pod, "model": query.model,
                                "page": 1, "perPage": query.per_page, "pages": 0, "matchingNodes": 0})
    ns, pod, model = query.namespace.lower(), query.pod.lower(), query.model.lower()

    def pod_matches(namespace: str, name: str) -> bool:
        return ns in namespace.lower() and pod in name.lower()

    nodes = doc["nodes"]
    if query.searching:
        nodes = [
            n
            for n in nodes
            if any(
                model in g["model"].lower()
                and (not (ns or pod) or any(pod_matches(p["namespace"], p["name"]) for p in g["pods"]))
                for g in n["gpus"]
            )
        ]
    pages = max(1, math.ceil(len(nodes) / query.per_page))
    page = min(query.page, pages)
    start = (page - 1) * query.per_page
    out = dict(doc)
    out["nodes"] = nodes[start : start + query.per_page]
    # Pod authors decide how many pods wait: the page lists a page's worth, counts the rest, and the
    # search narrows them (nodes are paged; pending pods are few unless something is wrong).
    pending = [p for p in doc["pending"]["pods"] if pod_matches(p["namespace"], p["name"])]
    out["pending"] = dict(doc["pending"], pods=pending[: query.per_page], more=max(0, len(pending) - query.per_page))
    if doc["defrag"] is not None and (ns or pod):
        moves = [m for m in doc["defrag"]["moves"] if pod_matches(*_split(m["pod"]))]
        out["defrag"] = dict(doc["defrag"], moves=moves)
    out["query"] = {
        "namespace": query.namespace,
        "pod": query.pod,
        "model": query.model,
        "page": page,
        "perPage": query.per_page,
        "pages": pages,
        "matchingNodes": len(nodes),
    }
    return out


def _split(key: str) -> tuple[str, str]:
    namespace, sep, name = key.partition("/")
    return (namespace, name) if sep else ("", key)


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _percent(part: int, whole: int) -> float:
    return round(100 * part / whole, 2) if whole else 0.0
