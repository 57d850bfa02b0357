"""The core's source of truth: what each node has and what each pod holds.

`ClusterState` rows are derived from these records by `write_node_row`, always
from scratch for one node, so the arrays cannot drift from the records however
pods and devices come and go.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from apis.allocation import Allocation, GPUShare, share_memory_bytes
from apis.devices import GPUInfo, MIGInstance, NodeDevices
from scheduler_plugin.core import memory_only, mig_placement, overcommit
from scheduler_plugin.core.api import NodeInfo, NodeName, PodRequest, PodUID
from scheduler_plugin.core.cluster import ClusterState
from scheduler_plugin.core.demand import FULL_PERCENT
from scheduler_plugin.core.noderules import HostPort
from scheduler_plugin.core.topology import NodeTopology, node_topology


@dataclass
class PodRecord:
    """A pod the core counts: bound (from the informer) or assumed (reserved, bind pending)."""

    request: PodRequest
    node: NodeName
    allocation: Allocation | None
    assumed: bool
    #: clock reading when it was reserved (assumed pods only)
    assumed_at: float = 0.0


@dataclass
class NodeRecord:
    name: NodeName
    info: NodeInfo | None = None
    devices: NodeDevices | None = None
    #: the node's GPUs in slot order (sorted by index)
    gpus: tuple[GPUInfo, ...] = ()
    slot_by_uuid: dict[str, int] = field(default_factory=dict)
    #: GPU minor -> slot, for annotations (Koordinator's) that name a GPU by minor only
    slot_by_minor: dict[int, int] = field(default_factory=dict)
    #: MIG instance uuid -> (GPU slot, instance)
    mig_by_uuid: dict[str, tuple[int, MIGInstance]] = field(default_factory=dict)
    #: GPU uuids held outside fgpu (e.g. by nvidia.com/gpu pods)
    external: frozenset[str] = frozenset()
    topology: NodeTopology = field(default_factory=lambda: NodeTopology((), (), ()))
    pods: dict[PodUID, PodRecord] = field(default_factory=dict)
    #: the node exists only while its Node object does (state read from the Kubernetes API): a
    #: Device outlives its deleted Node until the garbage collector removes it, and is no node
    require_info: bool = False

    @property
    def known(self) -> bool:
        """The node exists for scheduling: we have its Node facts, or its devices unless `require_info`."""
        return self.info is not None or (self.devices is not None and not self.require_info)

    @property
    def unused(self) -> bool:
        """Nothing left to keep the record for: no Node facts, no devices, no pods."""
        return self.info is None and self.devices is None and not self.pods

    def set_devices(self, devices: NodeDevices | None) -> None:
        self.devices = devices
        gpus = tuple(sorted(devices.gpus, key=lambda g: (g.index, g.minor))) if devices else ()
        self.gpus = gpus
        self.slot_by_uuid = {gpu.uuid: slot for slot, gpu in enumerate(gpus)}
        self.slot_by_minor = {gpu.minor: slot for slot, gpu in enumerate(gpus)}
        self.mig_by_uuid = {
            mig.uuid: (slot, mig)
            for slot, gpu in enumerate(gpus)
            if gpu.mig_enabled
            for mig in gpu.mig_instances
        }
        self.external = frozenset(h.gpu_uuid for h in devices.external_holders) if devices else frozenset()
        self.topology = node_topology(gpus)

    def usable(self, slot: int) -> bool:
        """Takes regular shares: healthy, not held outside fgpu, not in MIG mode."""
        gpu = self.gpus[slot]
        return gpu.healthy and not gpu.mig_enabled and gpu.uuid not in self.external

    def share_slot(self, share: GPUShare) -> int | None:
        """The GPU slot a share of an allocation sits on, or None when the node has no such GPU."""
        if share.mig_uuid:
            found = self.mig_by_uuid.get(share.mig_uuid)
            return found[0] if found else None
        if not share.uuid:
            return self.slot_by_minor.get(share.minor)
        return self.slot_by_uuid.get(share.uuid)

    def used_migs(self) -> set[str]:
        return {
            share.mig_uuid
            for pod in self.pods.values()
            if pod.allocation
            for share in pod.allocation.gpus
            if share.mig_uuid
        }

    def gpu_usage(self) -> tuple[list[int], list[int]]:
        """Allocated core percent and memory bytes per GPU slot (regular shares only)."""
        core = [0] * len(self.gpus)
        memory = [0] * len(self.gpus)
        for pod in self.pods.values():
            if pod.allocation is None:
                continue
            for share in pod.allocation.gpus:
                if share.mig_uuid:
                    continue
                slot = self.share_slot(share)
                if slot is not None:
                    core[slot] += share.core_percent
                    memory[slot] += share_memory_bytes(share, gpu_memory_bytes=self.gpus[slot].memory_bytes)
        return core, memory

    def memory_only_slots(self) -> set[int]:
        """GPU slots holding a memory-only share (core/memory_only.py)."""
        return {
            slot
            for pod in self.pods.values()
            if pod.allocation
            for share in pod.allocation.gpus
            if share.core_percent == 0
            and memory_only.share_is_memory_only(share)
            and (slot := self.share_slot(share)) is not None
        }

    def host_usage(self) -> tuple[int, int]:
        cpu = sum(pod.request.cpu_milli for pod in self.pods.values())
        memory = sum(pod.request.memory_bytes for pod in self.pods.values())
        return cpu, memory

    def host_ports(self) -> tuple[HostPort, ...]:
        """Host ports held by the pods counted on the node (assumed ones included, as kube-scheduler does)."""
        return tuple(port for pod in self.pods.values() for port in pod.request.node_needs.host_ports)

    def dangling_shares(self) -> list[tuple[PodRecord, GPUShare]]:
        """Shares of pods on this node whose GPU (or MIG instance) the node does not report."""
        return [
            (pod, share)
            for pod in self.pods.values()
            if pod.allocation
            for share in pod.allocation.gpus
            if self.share_slot(share) is None
        ]


def write_node_row(state: ClusterState, record: NodeRecord, slot: int) -> None:
    """Rewrites the node's row of `state` from its record."""
    gpus = record.gpus
    count = len(gpus)
    state.ensure_gpu_columns(count)
    width = state.max_gpus
    pad = width - count
    core_used, mem_used = record.gpu_usage()
    used_migs = record.used_migs() if record.mig_by_uuid else set()

    present = [True] * count + [False] * pad
    healthy = [gpu.healthy for gpu in gpus] + [False] * pad
    usable = [record.usable(i) for i in range(count)] + [False] * pad
    core_total = [FULL_PERCENT] * count + [0] * pad
    mem_total = [gpu.memory_bytes for gpu in gpus] + [0] * pad
    core_free = [FULL_PERCENT - core_used[i] if usable[i] else 0 for i in range(count)] + [0] * pad
    mem_free = [gpus[i].memory_bytes - mem_used[i] if usable[i] else 0 for i in range(count)] + [0] * pad
    model_id = [state.model_index(gpu.model_label) for gpu in gpus] + [-1] * pad
    allocations = [pod.allocation for pod in record.pods.values() if pod.allocation] if any(g.mig_enabled for g in gpus) else []
    mig_free = [
        # A free instance, or one the node could create (core/mig_placement.py).
        mig_placement.largest_free_memory(
            mig_placement.GPUSlot(i, gpu, frozenset(used_migs), mig_placement.promised_on(gpu, allocations))
        )
        if gpu.mig_enabled and gpu.healthy and gpu.uuid not in record.external
        else 0
        for i, gpu in enumerate(gpus)
    ] + [0] * pad
    topo = record.topology
    state.gpu_present[slot] = present
    state.gpu_healthy[slot] = healthy
    state.gpu_usable[slot] = usable
    state.gpu_whole_free[slot] = [
        usable[i] and core_used[i] == 0 and mem_used[i] == 0 for i in range(count)
    ] + [False] * pad
    state.core_total[slot] = core_total
    state.core_free[slot] = core_free
    state.mem_total[slot] = mem_total
    state.mem_free[slot] = mem_free
    state.model_id[slot] = model_id
    state.mig_free_max[slot] = mig_free
    mem_only = record.memory_only_slots()
    if mem_only or slot in state.mem_only_rows:  # a row without any is all False already
        state.mem_only_held[slot] = [i in mem_only for i in range(count)] + [False] * pad
    state.nvlink_group[slot] = list(topo.nvlink) + [-1] * pad
    state.pcie_group[slot] = list(topo.pcie) + [-1] * pad
    state.numa_group[slot] = list(topo.numa) + [-1] * pad
    g_core, g_mem, b_core, b_mem = overcommit.gpu_columns(
        [pod.allocation for pod in record.pods.values() if pod.allocation], record.share_slot, gpus
    )
    state.guaranteed_core[slot] = g_core + [0] * pad
    state.guaranteed_mem[slot] = g_mem + [0] * pad
    state.burst_core[slot] = b_core + [0] * pad
    state.burst_mem[slot] = b_mem + [0] * pad
    state.burst_ratio[slot] = overcommit.ratio_of(info.labels) if (info := record.info) else 0

    cpu_used, host_used = record.host_usage()
    info = record.info
    state.active[slot] = record.known
    state.has_devices[slot] = record.devices is not None
    state.cpu_alloc[slot] = info.cpu_milli if info else 0
    state.cpu_free[slot] = (info.cpu_milli - cpu_used) if info else 0
    state.host_mem_alloc[slot] = info.memory_bytes if info else 0
    state.host_mem_free[slot] = (info.memory_bytes - host_used) if info else 0
    state.gpu_count[slot] = count
    state.node_core_total[slot] = sum(core_total)
    state.node_core_free[slot] = sum(core_free)
    state.node_mem_total[slot] = sum(mem_total)
    state.node_mem_free[slot] = sum(mem_free)
    state.node_mem_max[slot] = max(mem_total, default=0)
    state.mixed_models[slot] = len(set(model_id[:count])) > 1
    _write_node_rules(state, record, slot)
    if any(mig_free):
        state.mig_rows.add(slot)
    else:
        state.mig_rows.discard(slot)
    if mem_only:
        state.mem_only_rows.add(slot)
    else:
        state.mem_only_rows.discard(slot)
    state.notify_changed(slot)


def _write_node_rules(state: ClusterState, record: NodeRecord, slot: int) -> None:
    rules = record.info.rules if record.info else None
    if rules is None:
        state.rules_rows.discard(slot)
    else:
        state.rules_rows.add(slot)
    state.taint_set[slot] = state.taint_set_id(rules.taints) if rules is not None else 0
    state.max_pods[slot] = rules.max_pods if rules is not None else 0
    state.limits_unenforced[slot] = bool(rules is not None and rules.limits_unenforced)
    if rules is not None and rules.limits_unenforced:
        state.limits_why[slot] = rules.limits_unenforced
    else:
        state.limits_why.pop(slot, None)
    state.pod_count[slot] = len(record.pods)
    ports = record.host_ports()
    state.has_host_ports[slot] = bool(ports)
    if ports:
        state.host_ports[slot] = ports
    else:
        state.host_ports.pop(slot, None)
