"""How a node's GPUs are connected: NVLink groups, PCIe roots, NUMA nodes, partitions.

Each GPU slot gets a small integer group id per kind (-1 = in no group of that
kind), so the filter can count free GPUs per group with array operations.

NVLink groups are the connected components of the NVLink matrix the agent
reports. When a node reports no matrix but is an 8-GPU Hopper/Ampere NVSwitch
board (HGX/DGX A100, A800, H100, H800, H200, H20), all eight GPUs form one
NVLink group and the board's fabric partitions are known: the ones NVIDIA's
Fabric Manager defines for shared-NVSwitch mode, by GPU index
(8 = all; 4 = 0-3, 4-7; 2 = 0-1, 2-3, 4-5, 6-7; 1 = each). Whole-GPU pods
of those sizes are placed on a free partition, preferring one whose parent
partition is already in use, so large partitions stay whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from apis.devices import GPUInfo
from scheduler_plugin.core.cluster import NO_GROUP

#: Model labels of 8-GPU boards whose GPUs all share NVSwitches.
_NVSWITCH_BOARD_MODELS = re.compile(r"^(A100|A800|H100|H800|H200|H20)(-SXM|.*HBM|$)", re.IGNORECASE)
_BOARD_GPUS = 8

#: Fabric Manager's shared-NVSwitch partitions of an 8-GPU board, by GPU index.
HGX_PARTITIONS: Mapping[int, tuple[tuple[int, ...], ...]] = {
    8: ((0, 1, 2, 3, 4, 5, 6, 7),),
    4: ((0, 1, 2, 3), (4, 5, 6, 7)),
    2: ((0, 1), (2, 3), (4, 5), (6, 7)),
    1: tuple((i,) for i in range(_BOARD_GPUS)),
}


@dataclass(frozen=True)
class NodeTopology:
    """Group ids per GPU slot (the node's GPUs in index order)."""

    nvlink: tuple[int, ...]
    pcie: tuple[int, ...]
    numa: tuple[int, ...]
    #: partition size -> partitions as GPU slot tuples; empty when the board has no table
    partitions: Mapping[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)


def is_nvswitch_board(gpus: Sequence[GPUInfo]) -> bool:
    """An 8-GPU board of one Hopper/Ampere SXM model (the kind with a built-in partition table)."""
    if len(gpus) != _BOARD_GPUS:
        return False
    models = {gpu.model_label for gpu in gpus}
    if len(models) != 1:
        return False
    label = next(iter(models))
    return bool(_NVSWITCH_BOARD_MODELS.match(label)) and "PCIE" not in label.upper()


def _nvlink_components(gpus: Sequence[GPUInfo]) -> tuple[int, ...]:
    by_key: dict[str, int] = {}
    for slot, gpu in enumerate(gpus):
        for key in (gpu.uuid, gpu.topology.bus_id):
            if key:
                by_key[key.lower()] = slot
    parent = list(range(len(gpus)))

    def find(slot: int) -> int:
        while parent[slot] != slot:
            parent[slot] = parent[parent[slot]]
            slot = parent[slot]
        return slot

    linked = [False] * len(gpus)
    for slot, gpu in enumerate(gpus):
        for peer in gpu.topology.nvlink_peers:
            other = by_key.get(peer.uuid.lower()) if peer.uuid else None
            if other is None and peer.bus_id:
                other = by_key.get(peer.bus_id.lower())
            if other is None or other == slot or peer.links <= 0:
                continue
            linked[slot] = linked[other] = True
            parent[find(slot)] = find(other)
    return _dense_ids([find(slot) if linked[slot] else None for slot in range(len(gpus))])


def _dense_ids(keys: Sequence[object | None]) -> tuple[int, ...]:
    """Small ids 0.. for the distinct non-None keys, in first-seen order; None -> NO_GROUP."""
    ids: dict[object, int] = {}
    out = []
    for key in keys:
        if key is None:
            out.append(NO_GROUP)
            continue
        out.append(ids.setdefault(key, len(ids)))
    return tuple(out)


def node_topology(gpus: Sequence[GPUInfo]) -> NodeTopology:
    """Group ids for `gpus`, which must be in slot order (sorted by index)."""
    reports_matrix = any(gpu.topology.nvlink_peers for gpu in gpus)
    partitions: Mapping[int, tuple[tuple[int, ...], ...]] = {}
    if reports_matrix:
        nvlink = _nvlink_components(gpus)
    elif is_nvswitch_board(gpus):
        nvlink = (0,) * len(gpus)
        partitions = HGX_PARTITIONS
    else:
        nvlink = (NO_GROUP,) * len(gpus)
    pcie = _dense_ids([gpu.topology.pcie_root.lower() or None for gpu in gpus])
    numa = _dense_ids([gpu.topology.numa_node if gpu.topology.numa_node >= 0 else None for gpu in gpus])
    return NodeTopology(nvlink=nvlink, pcie=pcie, numa=numa, partitions=partitions)
