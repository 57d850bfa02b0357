"""Prometheus metrics of the scheduler service.

Each service instance owns its registry, so two instances in one process (the
leader-failover test, the benchmark) never collide on metric names.
"""

from __future__ import annotations

import collections
import enum
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from time import perf_counter

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from scheduler_plugin.core.api import NodeView


class Phase(enum.Enum):
    FILTER = "filter"
    SCORE = "score"
    RESERVE = "reserve"
    BIND = "bind"
    REBUILD = "rebuild"


class Result(enum.Enum):
    SCHEDULED = "scheduled"
    UNSCHEDULABLE = "unschedulable"
    ERROR = "error"


class ReasonKind(enum.Enum):
    """The `reason` label of fgpu_scheduler_unschedulable_reasons_total: why a node was rejected, as a
    fixed set of kinds the scheduler decides (docs/scheduler.md lists them).

    Never the reason's text: it quotes what the pod wrote (its model lists, nodeSelector, job name),
    and each new text would be a new series for good, so a pod author could grow Prometheus at will.
    The full text is in the extender's answer, the FailedScheduling Event and the log.
    """

    UNKNOWN_NODE = "unknown_node"
    NODE_SELECTOR = "node_selector"
    NODE_AFFINITY = "node_affinity"
    TAINT = "taint"
    NODE_CORDONED = "node_cordoned"
    NODE_NOT_READY = "node_not_ready"
    HOST_PORT = "host_port"
    TOO_MANY_PODS = "too_many_pods"
    GPU_LIMITS_UNENFORCED = "gpu_limits_unenforced"
    INSUFFICIENT_CPU = "insufficient_cpu"
    INSUFFICIENT_MEMORY = "insufficient_memory"
    NO_DEVICE_REPORT = "no_device_report"
    GPU_DISCOVERY_FAILED = "gpu_discovery_failed"
    NO_GPUS = "no_gpus"
    GPU_MODEL = "gpu_model"
    TOO_FEW_GPUS = "too_few_gpus"
    GPUS_UNHEALTHY = "gpus_unhealthy"
    GPUS_NOT_USABLE = "gpus_not_usable"
    NO_MIG_GPU = "no_mig_gpu"
    NO_MIG_INSTANCE = "no_mig_instance"
    GPU_MEMORY_TOO_SMALL = "gpu_memory_too_small"
    GPUS_BUSY = "gpus_busy"
    GPU_SHARE_BUSY = "gpu_share_busy"
    MEMORY_ONLY_SHARE = "memory_only_share"
    BURSTABLE_RATIO = "burstable_ratio"
    MIXED_MODELS = "mixed_models"
    TOPOLOGY = "topology"
    STANDALONE_UNCHECKED = "standalone_unchecked"
    OTHER = "other"


#: The core's reason words (scheduler_plugin/core/reasons.py, reasons_bulk.py, noderules.py,
#: overcommit.py, memory_only.py) by how each begins, in order; a text none matches is OTHER.
#: Whatever a pod puts in its text, the label is one of ReasonKind's values.
_KIND_PATTERNS: tuple[tuple[re.Pattern[str], ReasonKind], ...] = tuple(
    (re.compile(pattern, re.DOTALL), kind)
    for pattern, kind in (
        (r"node is not known to the fgpu scheduler", ReasonKind.UNKNOWN_NODE),
        (r"node matches none of the pod's required node affinity terms", ReasonKind.NODE_AFFINITY),
        (r"node has .*, pod's nodeSelector needs ", ReasonKind.NODE_SELECTOR),
        (r"node has taint .* the pod does not tolerate$", ReasonKind.TAINT),
        (r"node is cordoned", ReasonKind.NODE_CORDONED),
        (r"node is not ready|node is unreachable|node's network is unavailable", ReasonKind.NODE_NOT_READY),
        (r"host port .* is in use on the node$", ReasonKind.HOST_PORT),
        (r"too many pods: ", ReasonKind.TOO_MANY_PODS),
        (r"node cannot enforce GPU share limits", ReasonKind.GPU_LIMITS_UNENFORCED),
        (r"insufficient cpu: ", ReasonKind.INSUFFICIENT_CPU),
        (r"insufficient memory: ", ReasonKind.INSUFFICIENT_MEMORY),
        (r"node has no Device report", ReasonKind.NO_DEVICE_REPORT),
        (r"GPU discovery failed on the node", ReasonKind.GPU_DISCOVERY_FAILED),
        (r"node has no GPUs$", ReasonKind.NO_GPUS),
        (r"job .* runs on model |model .* (not in use|in avoid) list ", ReasonKind.GPU_MODEL),
        (r"node has \d+ GPUs?, pod needs ", ReasonKind.TOO_FEW_GPUS),
        (r"\d+ of \d+ GPUs healthy, ", ReasonKind.GPUS_UNHEALTHY),
        (r"\d+ of \d+ healthy GPUs usable ", ReasonKind.GPUS_NOT_USABLE),
        (r"pod asks for a MIG instance ", ReasonKind.NO_MIG_GPU),
        (r"no free MIG instance holds ", ReasonKind.NO_MIG_INSTANCE),
        (r"pod needs .* GPU memory per card, largest GPU here has ", ReasonKind.GPU_MEMORY_TOO_SMALL),
        (r"\d+ of \d+ GPUs fully free, ", ReasonKind.GPUS_BUSY),
        (r"no GPU has \d+% core and .* memory free for |\d+ of \d+ GPUs can take a card, ", ReasonKind.GPU_SHARE_BUSY),
        (r"\d+ GPU shares? of .* asks for GPU memory only, |the GPUs here with room for .* hold another pod's "
         r"memory-only share", ReasonKind.MEMORY_ONLY_SHARE),
        (r"node takes no burstable GPU share|no GPU here keeps the burstable limits ", ReasonKind.BURSTABLE_RATIO),
        (r"no GPU model has \d+ ", ReasonKind.MIXED_MODELS),
        (r"no (NVLink group|PCIe root|NUMA node) has ", ReasonKind.TOPOLOGY),
        (r"pod needs what standalone mode does not check", ReasonKind.STANDALONE_UNCHECKED),
    )
)


# Buckets from 50 µs: one filter over a small cluster takes well under a millisecond.
_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "fgpu_scheduler_decisions", "Scheduling decisions, by result.", ["result"], registry=self.registry
        )
        self.phase_seconds = Histogram(
            "fgpu_scheduler_phase_duration_seconds",
            "Time spent per scheduling phase.",
            ["phase"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.unschedulable_reasons = Counter(
            "fgpu_scheduler_unschedulable_reasons",
            "Nodes rejected, by the kind of reason: one of a fixed set (docs/scheduler.md), never the reason's text.",
            ["reason"],
            registry=self.registry,
        )
        for kind in ReasonKind:  # every kind is a series from the start: rate() sees its first rejection
            self.unschedulable_reasons.labels(reason=kind.value)
        self.orphaned_allocations = Counter(
            "fgpu_scheduler_orphaned_allocations",
            "Allocations found on GPUs that no longer exist (reported, not dropped).",
            registry=self.registry,
        )
        self.bind_failures = Counter(
            "fgpu_scheduler_bind_failures", "Binds that failed, by step.", ["step"], registry=self.registry
        )
        self.gpu_core_allocated = Gauge(
            "fgpu_scheduler_gpu_core_allocated_percent",
            "Core percent allocated, summed over the GPUs of a node and model.",
            ["node", "model"],
            registry=self.registry,
        )
        self.gpu_core_capacity = Gauge(
            "fgpu_scheduler_gpu_core_capacity_percent",
            "Core percent of the healthy GPUs of a node and model (100 per GPU).",
            ["node", "model"],
            registry=self.registry,
        )
        self.gpu_memory_allocated = Gauge(
            "fgpu_scheduler_gpu_memory_allocated_bytes",
            "GPU memory allocated, summed over the GPUs of a node and model.",
            ["node", "model"],
            registry=self.registry,
        )
        self.gpu_memory_capacity = Gauge(
            "fgpu_scheduler_gpu_memory_capacity_bytes",
            "GPU memory of the healthy GPUs of a node and model.",
            ["node", "model"],
            registry=self.registry,
        )
        self.leader = Gauge("fgpu_scheduler_is_leader", "1 while this instance leads.", registry=self.registry)
        self.gpu_fragmentation = Gauge(
            "fgpu_scheduler_gpu_fragmentation_milli",
            "FGD's fragmentation of idle GPU capacity per model (milli-GPU; 1000 = one GPU), against the shapes placed now.",
            ["model"],
            registry=self.registry,
        )
        self.pending_gpu_pods = Gauge(
            "fgpu_scheduler_pending_gpu_pods",
            "GPU pods addressed to fgpu-scheduler and not bound.",
            registry=self.registry,
        )
        self.oldest_pending_gpu_pod = Gauge(
            "fgpu_scheduler_oldest_pending_gpu_pod_seconds",
            "How long the oldest pending GPU pod has existed (seconds since its creationTimestamp); 0 when none waits.",
            registry=self.registry,
        )
        self.unverified_allocations = Gauge(
            "fgpu_scheduler_unverified_allocations",
            "Bound pods whose allocation annotation does not verify, now; each is counted by the conservative "
            "rule (last verified allocation, else its request within what is free), named in an "
            "AllocationNotVerified Event and in fgpuctl inspect.",
            registry=self.registry,
        )
        self.unverified_allocations_found = Counter(
            "fgpu_scheduler_unverified_allocations_found",
            "Bound pods found with an allocation that does not verify (again after each new problem), by what "
            "is counted for them: last-verified, request or nothing.",
            ["counted"],
            registry=self.registry,
        )

    @contextmanager
    def timed(self, phase: Phase) -> Iterator[None]:
        start = perf_counter()
        try:
            yield
        finally:
            self.phase_seconds.labels(phase=phase.value).observe(perf_counter() - start)

    def record_reasons(self, reasons: Sequence[str]) -> None:
        """Counts rejections by kind; `reasons` are the verdicts' texts (a filter of thousands of nodes
        repeats a few texts, so each distinct one is classified once)."""
        by_kind: collections.Counter[ReasonKind] = collections.Counter()
        for reason, count in collections.Counter(reasons).items():
            by_kind[reason_kind(reason)] += count
        for kind, count in by_kind.items():
            self.unschedulable_reasons.labels(reason=kind.value).inc(count)

    def set_allocation(self, views: Sequence[NodeView]) -> None:
        """Replaces the per-node/model allocation gauges with the given views."""
        for gauge in (self.gpu_core_allocated, self.gpu_core_capacity, self.gpu_memory_allocated, self.gpu_memory_capacity):
            gauge.clear()
        for view in views:
            sums: dict[str, list[int]] = {}
            for gpu in view.gpus:
                model = gpu.device.model_label or gpu.device.model or "unknown"
                acc = sums.setdefault(model, [0, 0, 0, 0])
                acc[0] += gpu.allocated_core_percent
                acc[1] += gpu.allocated_memory_bytes
                if gpu.device.healthy:
                    acc[2] += 100
                    acc[3] += gpu.device.memory_bytes
            for model, (core, mem, core_cap, mem_cap) in sums.items():
                self.gpu_core_allocated.labels(node=view.name, model=model).set(core)
                self.gpu_memory_allocated.labels(node=view.name, model=model).set(mem)
                self.gpu_core_capacity.labels(node=view.name, model=model).set(core_cap)
                self.gpu_memory_capacity.labels(node=view.name, model=model).set(mem_cap)

    def set_fragmentation(self, by_model: Mapping[str, float]) -> None:
        self.gpu_fragmentation.clear()
        for model, milli in by_model.items():
            self.gpu_fragmentation.labels(model=model).set(milli)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def reason_kind(reason: str) -> ReasonKind:
    """The kind of a rejection reason, from how the core's words begin; OTHER for words it does not know."""
    for pattern, kind in _KIND_PATTERNS:
        if pattern.match(reason):
            return kind
    return ReasonKind.OTHER
