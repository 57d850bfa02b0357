"""The cluster as struct-of-arrays: one row per node slot, one column per GPU slot.

Filter and score run as a handful of numpy operations over these arrays, so a
decision over 10,000 nodes costs a few vectorised passes instead of a Python
loop per node. The arrays are derived data: the core rewrites a node's row
from its records (devices + pods) whenever something on that node changes, and
then tells the listeners (policies keeping caches) which row changed.

Reading rules for policies:

* index rows by node slot (`slot_of[name]`), columns by GPU slot (the node's
  GPUs in index order, padded with absent slots up to `max_gpus`);
* read the arrays through the attributes on every call and never keep a
  reference: they are replaced when the state grows (`state_resized` is called);
* a GPU that is not usable (absent, unhealthy, held outside fgpu, or in MIG
  mode) has `core_free` and `mem_free` 0, so it looks full;
* `mem_only_held` marks GPUs holding a memory-only share (0% compute, which the
  backends read as no compute limit): compute shares never join them
  (core/memory_only.py).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from scheduler_plugin.core.noderules import HostPort, Taint

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Group id of a GPU that belongs to no group of that kind.
NO_GROUP = -1
#: Distinct taint sets interned before the table is compacted to the ones nodes still carry.
_MAX_TAINT_SETS = 1024


class StateListener(Protocol):
    def node_changed(self, node: int) -> None: ...

    def state_resized(self) -> None: ...


class ClusterState:
    """Per-node and per-GPU numbers the vectorised filter and the policies read."""

    def __init__(self, *, capacity: int = 64, max_gpus: int = 8) -> None:
        self.capacity = 0
        self.max_gpus = max_gpus
        self.names: list[str] = []
        self.slot_of: dict[str, int] = {}
        self._free_slots: list[int] = []
        self.models: list[str] = []
        self.model_ids: dict[str, int] = {}
        self._listeners: list[StateListener] = []
        #: rows with a GPU in MIG mode that has a free instance (MIG checks are skipped without any)
        self.mig_rows: set[int] = set()
        #: rows with a GPU holding a memory-only share (the memory-only rule's check is skipped without any)
        self.mem_only_rows: set[int] = set()
        #: rows whose node rules are known (a Node object was seen); node rules are checked only there
        self.rules_rows: set[int] = set()
        #: distinct NoSchedule/NoExecute taint sets; `taint_set[row]` indexes it, 0 is "no taints"
        self.taint_sets: list[tuple[Taint, ...]] = [()]
        self._taint_set_ids: dict[tuple[Taint, ...], int] = {(): 0}
        #: row -> host ports held by the pods on the node (rows without any are absent)
        self.host_ports: dict[int, tuple[HostPort, ...]] = {}
        #: row -> why the node cannot enforce GPU share limits (rows that can are absent)
        self.limits_why: dict[int, str] = {}
        #: bumps whenever a node slot is added or released (node order may change)
        self.membership_version = 0
        #: bumps on every change of any row (anything derived from the arrays is stale)
        self.version = 0
        # node arrays
        self.active: BoolArray = np.zeros(0, dtype=np.bool_)
        self.has_devices: BoolArray = np.zeros(0, dtype=np.bool_)
        self.cpu_alloc: Int64Array = np.zeros(0, dtype=np.int64)
        self.cpu_free: Int64Array = np.zeros(0, dtype=np.int64)
        self.host_mem_alloc: Int64Array = np.zeros(0, dtype=np.int64)
        self.host_mem_free: Int64Array = np.zeros(0, dtype=np.int64)
        self.gpu_count: Int64Array = np.zeros(0, dtype=np.int64)
        #: per-node sums over GPUs of core_total/core_free/mem_total/mem_free
        self.node_core_total: Int64Array = np.zeros(0, dtype=np.int64)
        self.node_core_free: Int64Array = np.zeros(0, dtype=np.int64)
        self.node_mem_total: Int64Array = np.zeros(0, dtype=np.int64)
        self.node_mem_free: Int64Array = np.zeros(0, dtype=np.int64)
        #: the node has GPUs of more than one model (multi-card pods need per-model checks)
        self.mixed_models: BoolArray = np.zeros(0, dtype=np.bool_)
        #: memory of the node's largest GPU
        self.node_mem_max: Int64Array = np.zeros(0, dtype=np.int64)
        #: node rules (core/noderules.py): taint set id, allocatable pods (0 = not known), pods counted
        self.taint_set: Int64Array = np.zeros(0, dtype=np.int64)
        self.max_pods: Int64Array = np.zeros(0, dtype=np.int64)
        self.pod_count: Int64Array = np.zeros(0, dtype=np.int64)
        self.has_host_ports: BoolArray = np.zeros(0, dtype=np.bool_)
        #: the node's isolation backend cannot enforce shares (FgpuIsolationReady=False)
        self.limits_unenforced: BoolArray = np.zeros(0, dtype=np.bool_)
        #: the node pool's burstable ratio in thousandths, 0 = no burstable share (core/overcommit.py)
        self.burst_ratio: Int64Array = np.zeros(0, dtype=np.int64)
        # GPU arrays, shape (capacity, max_gpus)
        self.gpu_present: BoolArray = np.zeros((0, max_gpus), dtype=np.bool_)
        self.gpu_healthy: BoolArray = np.zeros((0, max_gpus), dtype=np.bool_)
        self.gpu_usable: BoolArray = np.zeros((0, max_gpus), dtype=np.bool_)
        #: usable and entirely free (can take a whole-GPU card)
        self.gpu_whole_free: BoolArray = np.zeros((0, max_gpus), dtype=np.bool_)
        self.core_total: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.core_free: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.mem_total: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.mem_free: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.model_id: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.nvlink_group: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.pcie_group: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.numa_group: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        #: memory of the largest free MIG instance on a GPU in MIG mode, else 0
        self.mig_free_max: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        #: a regular share of 0% compute without a compute limit sits on the GPU (core/memory_only.py)
        self.mem_only_held: BoolArray = np.zeros((0, max_gpus), dtype=np.bool_)
        #: per GPU: guaranteed shares' requests, burstable shares' limits (core/overcommit.py)
        self.guaranteed_core: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.guaranteed_mem: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.burst_core: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self.burst_mem: Int64Array = np.zeros((0, max_gpus), dtype=np.int64)
        self._grow(capacity=max(capacity, 1), max_gpus=max_gpus)

    _NODE_FIELDS = (
        "active",
        "has_devices",
        "cpu_alloc",
        "cpu_free",
        "host_mem_alloc",
        "host_mem_free",
        "gpu_count",
        "node_core_total",
        "node_core_free",
        "node_mem_total",
        "node_mem_free",
        "node_mem_max",
        "mixed_models",
        "taint_set",
        "max_pods",
        "pod_count",
        "has_host_ports",
        "limits_unenforced",
        "burst_ratio",
    )
    _GPU_FIELDS = (
        "gpu_present",
        "gpu_healthy",
        "gpu_usable",
        "gpu_whole_free",
        "core_total",
        "core_free",
        "mem_total",
        "mem_free",
        "model_id",
        "nvlink_group",
        "pcie_group",
        "numa_group",
        "mig_free_max",
        "mem_only_held",
        "guaranteed_core",
        "guaranteed_mem",
        "burst_core",
        "burst_mem",
    )
    _GPU_FILL = {
        "model_id": NO_GROUP,
        "nvlink_group": NO_GROUP,
        "pcie_group": NO_GROUP,
        "numa_group": NO_GROUP,
    }

    # --- listeners --------------------------------------------------------------

    def add_listener(self, listener: StateListener) -> None:
        if not any(existing is listener for existing in self._listeners):
            self._listeners.append(listener)

    def notify_changed(self, node: int) -> None:
        self.version += 1
        for listener in self._listeners:
            listener.node_changed(node)

    # --- slots ------------------------------------------------------------------

    def slot(self, name: str) -> int:
        """The slot of a node, allocated on first use."""
        existing = self.slot_of.get(name)
        if existing is not None:
            return existing
        if not self._free_slots:
            self._grow(capacity=self.capacity * 2, max_gpus=self.max_gpus)
        index = self._free_slots.pop()
        self.slot_of[name] = index
        self.names[index] = name
        self.membership_version += 1
        return index

    def release(self, name: str) -> None:
        """Frees a node's slot (the node is gone and nothing refers to it)."""
        index = self.slot_of.pop(name, None)
        if index is None:
            return
        self.names[index] = ""
        self.mig_rows.discard(index)
        self.mem_only_rows.discard(index)
        self.rules_rows.discard(index)
        self.host_ports.pop(index, None)
        self.limits_why.pop(index, None)
        self._clear_row(index)
        self._free_slots.append(index)
        self.membership_version += 1
        self.notify_changed(index)

    def ensure_gpu_columns(self, count: int) -> None:
        if count > self.max_gpus:
            self._grow(capacity=self.capacity, max_gpus=max(count, self.max_gpus * 2))

    def model_index(self, model: str) -> int:
        existing = self.model_ids.get(model)
        if existing is not None:
            return existing
        self.model_ids[model] = len(self.models)
        self.models.append(model)
        return self.model_ids[model]

    def active_slots(self) -> npt.NDArray[np.intp]:
        return np.flatnonzero(self.active)

    def taint_set_id(self, taints: tuple[Taint, ...]) -> int:
        """The id of a taint set, interned: nodes share few distinct sets, so a pod's tolerations
        are checked once per set rather than once per node."""
        existing = self._taint_set_ids.get(taints)
        if existing is not None:
            return existing
        if len(self.taint_sets) >= _MAX_TAINT_SETS:
            self._compact_taint_sets()
        self._taint_set_ids[taints] = len(self.taint_sets)
        self.taint_sets.append(taints)
        return self._taint_set_ids[taints]

    def _compact_taint_sets(self) -> None:
        # Taints with changing values (timestamps, counters) would otherwise grow the table forever.
        used = sorted(set(self.taint_set.tolist()) - {0})
        remap = np.zeros(len(self.taint_sets), dtype=np.int64)
        sets: list[tuple[Taint, ...]] = [()]
        for old in used:
            remap[old] = len(sets)
            sets.append(self.taint_sets[old])
        self.taint_set = remap[self.taint_set]
        self.taint_sets = sets
        self._taint_set_ids = {taints: i for i, taints in enumerate(sets)}
        self.version += 1

    # --- internals --------------------------------------------------------------

    def _clear_row(self, index: int) -> None:
        for name in self._NODE_FIELDS:
            getattr(self, name)[index] = 0
        for name in self._GPU_FIELDS:
            getattr(self, name)[index, :] = self._GPU_FILL.get(name, 0)

    def _grow(self, *, capacity: int, max_gpus: int) -> None:
        old_capacity = self.capacity
        for name in self._NODE_FIELDS:
            old = getattr(self, name)
            new = np.zeros(capacity, dtype=old.dtype)
            new[:old_capacity] = old
            setattr(self, name, new)
        for name in self._GPU_FIELDS:
            old = getattr(self, name)
            new = np.full((capacity, max_gpus), self._GPU_FILL.get(name, 0), dtype=old.dtype)
            new[: old.shape[0], : old.shape[1]] = old
            setattr(self, name, new)
        self.names.extend("" for _ in range(capacity - old_capacity))
        # Hand out low slots first so slot order follows arrival order.
        self._free_slots.extend(range(capacity - 1, old_capacity - 1, -1))
        self._free_slots.sort(reverse=True)
        self.capacity = capacity
        self.max_gpus = max_gpus
        self.version += 1
        for listener in self._listeners:
            listener.state_resized()
