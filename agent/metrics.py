"""The agent's Prometheus metrics, in a registry of its own.

Per-GPU and per-pod gauges follow the latest usage cycle: label sets that
disappear (a pod ended, a GPU left) are removed, not left at their last value.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent.usage import GPUUsage
from apis import names
from apis.devices import NodeDevices


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.nvml_up = Gauge("fgpu_agent_nvml_up", "1 when NVML answered at the last discovery.", registry=r)
        self.gpu_healthy = Gauge("fgpu_agent_gpu_healthy", "1 when the GPU is healthy.", ["uuid", "model"], registry=r)
        self.gpu_memory_total = Gauge(
            names.AGENT_METRIC_GPU_MEMORY_TOTAL, "GPU memory in bytes.", ["uuid"], registry=r
        )
        self.gpu_memory_used = Gauge(
            "fgpu_agent_gpu_memory_used_bytes", "GPU memory in use in bytes.", ["uuid"], registry=r
        )
        self.gpu_sm = Gauge(
            names.AGENT_METRIC_GPU_SM_UTILIZATION, "SM utilization over NVML's last sample.", ["uuid"], registry=r
        )
        self.pod_memory = Gauge(
            names.AGENT_METRIC_POD_GPU_MEMORY_USED, "GPU memory used by a pod's processes.", ["pod_uid", "uuid"], registry=r
        )
        self.pod_processes = Gauge(
            names.AGENT_METRIC_POD_GPU_PROCESSES, "Processes of a pod on a GPU.", ["pod_uid", "uuid"], registry=r
        )
        self.health_transitions = Counter(
            "fgpu_agent_health_transitions_total", "GPU health changes.", ["uuid", "to", "reason"], registry=r
        )
        self.xid_events = Counter("fgpu_agent_xid_events_total", "Xid events seen.", ["uuid", "xid"], registry=r)
        self.report_seconds = Histogram(
            "fgpu_agent_report_seconds", "Time to write one report.", ["target"], registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.report_errors = Counter("fgpu_agent_report_errors_total", "Failed report writes.", ["target"], registry=r)
        self.usage_cycle_cpu = Histogram(
            "fgpu_agent_usage_cycle_cpu_seconds", "CPU time of one usage cycle.", registry=r,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1),
        )
        self.poll_errors = Counter(
            "fgpu_agent_poll_errors_total", "NVML poll cycles that raised an unexpected error.", registry=r
        )
        self.admitted_pods = Gauge(
            "fgpu_agent_admitted_pods", "Pods holding GPU shares admitted by the hook on this node.", registry=r
        )
        self.admissions_swept = Counter(
            "fgpu_agent_admissions_swept_total",
            "Admission ledger entries released because the pod was gone or finished (PostStopPodSandbox missed).",
            ["reason"], registry=r,
        )
        self.admissions_restored = Counter(
            "fgpu_agent_admissions_restored_total",
            "Admission ledger entries restored after an agent start from the verified allocations of running pods.",
            registry=r,
        )
        self.admissions_not_restored = Counter(
            "fgpu_agent_admissions_not_restored_total",
            "Running pods with an allocation that the ledger rebuild did not count (unverified, holds nothing).",
            ["reason"], registry=r,
        )
        self.hook_decisions = Counter(
            "fgpu_agent_hook_decisions_total", "PreCreateContainer answers.", ["outcome"], registry=r
        )
        self.isolation_ready = Gauge(
            "fgpu_agent_isolation_ready",
            "1 when the node's isolation backend can enforce GPU shares (0: the hook rejects shares; reason says why).",
            ["isolation", "reason"], registry=r,
        )
        self.mig_instances_created = Counter(
            "fgpu_agent_mig_instances_created_total",
            "MIG instances (GPU and compute instance) the agent created for pods' allocations.", registry=r,
        )
        self.mig_instances_destroyed = Counter(
            "fgpu_agent_mig_instances_destroyed_total",
            "MIG instances the agent created and destroyed again once no pod held them.", registry=r,
        )
        self.mig_instance_failures = Counter(
            "fgpu_agent_mig_instance_failures_total",
            "MIG creates refused (the container was rejected) and destroys NVML refused (the instance stays).",
            ["action"], registry=r,
        )
        for action in ("create", "destroy"):
            self.mig_instance_failures.labels(action)
        self._isolation_labels: tuple[str, str] | None = None
        self._gpu_labels: set[str] = set()
        self._pod_labels: set[tuple[str, str]] = set()
        self._health_labels: set[tuple[str, str]] = set()
        self._memory_labels: set[str] = set()
        #: observe_devices (any thread that changes the report) and observe_usage (the poll loop)
        #: both edit the per-GPU label sets; one at a time, so no removed series comes back.
        self._lock = threading.Lock()

    def observe_devices(self, devices: NodeDevices) -> None:
        """The report's GPUs; every series of a GPU no longer reported goes (NVML down leaves none)."""
        with self._lock:
            self._observe_devices(devices)

    def _observe_devices(self, devices: NodeDevices) -> None:
        self.nvml_up.set(0 if devices.discovery_error else 1)
        labels = {(g.uuid, g.model_label) for g in devices.gpus}
        for uuid, model in self._health_labels - labels:
            self.gpu_healthy.remove(uuid, model)
        self._health_labels = labels
        reported = {g.uuid for g in devices.gpus}
        for uuid in self._memory_labels - reported:
            self.gpu_memory_total.remove(uuid)
        self._memory_labels = reported
        self._drop_usage(keep=reported | {m.uuid for g in devices.gpus for m in g.mig_instances})
        for g in devices.gpus:
            self.gpu_healthy.labels(g.uuid, g.model_label).set(1 if g.healthy else 0)
            self.gpu_memory_total.labels(g.uuid).set(g.memory_bytes)

    def observe_isolation(self, isolation: str, *, ready: bool, reason: str) -> None:
        """One series at a time: the backend and why it is (not) ready."""
        labels = (isolation, reason)
        if self._isolation_labels is not None and self._isolation_labels != labels:
            self.isolation_ready.remove(*self._isolation_labels)
        self._isolation_labels = labels
        self.isolation_ready.labels(*labels).set(1 if ready else 0)

    def observe_usage(self, usage: Iterable[GPUUsage]) -> None:
        with self._lock:
            self._observe_usage(usage)

    def _observe_usage(self, usage: Iterable[GPUUsage]) -> None:
        gpus: set[str] = set()
        pods: dict[tuple[str, str], tuple[int, int]] = {}
        for u in usage:
            gpus.add(u.uuid)
            self.gpu_memory_used.labels(u.uuid).set(u.memory_used_bytes)
            self.gpu_sm.labels(u.uuid).set(u.sm_utilization_percent)
            for p in u.processes:
                if not p.pod_uid:
                    continue
                memory, count = pods.get((p.pod_uid, u.uuid), (0, 0))
                pods[(p.pod_uid, u.uuid)] = (memory + p.used_memory_bytes, count + 1)
        for uuid in self._gpu_labels - gpus:
            self.gpu_memory_used.remove(uuid)
            self.gpu_sm.remove(uuid)
        for key in self._pod_labels - set(pods):
            self.pod_memory.remove(*key)
            self.pod_processes.remove(*key)
        for key, (memory, count) in pods.items():
            self.pod_memory.labels(*key).set(memory)
            self.pod_processes.labels(*key).set(count)
        self._gpu_labels, self._pod_labels = gpus, set(pods)

    def _drop_usage(self, *, keep: set[str]) -> None:
        """Removes the usage series (the GPU's and its pods') of GPUs and MIG instances not in `keep`."""
        for uuid in self._gpu_labels - keep:
            self.gpu_memory_used.remove(uuid)
            self.gpu_sm.remove(uuid)
        for key in {k for k in self._pod_labels if k[1] not in keep}:
            self.pod_memory.remove(*key)
            self.pod_processes.remove(*key)
        self._gpu_labels &= keep
        self._pod_labels = {k for k in self._pod_labels if k[1] in keep}

    def exposition(self) -> bytes:
        return bytes(generate_latest(self.registry))
