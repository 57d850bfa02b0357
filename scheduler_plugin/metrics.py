"""Prometheus metrics of the scheduler service.

Each service instance owns its registry, so two instances in one process (the
leader-failover test, the benchmark) never collide on metric names.
"""

from __future__ import annotations

import enum
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
            "Nodes rejected, by the kind of reason (the reason text with numbers removed).",
            ["reason"],
            registry=self.registry,
        )
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
        for reason in reasons:
            self.unschedulable_reasons.labels(reason=reason_kind(reason)).inc()

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


def reason_kind(reason: str) -> str:
    """A low-cardinality label for a reason: digits replaced, cut to 80 characters."""
    out: list[str] = []
    for ch in reason:
        if ch.isdigit():
            if not out or out[-1] != "N":
                out.append("N")
        else:
            out.append(ch)
    return "".join(out)[:80]
