"""How a node's GPUs are connected: NVLink groups, PCIe roots, NUMA nodes, partitions.

Each GPU slot gets a small integer group id per kind (-1 = in no group of that
kind), so the filter can count free GPUs per group with array operations.

NVLink groups are the connected components of the NVLink matrix the agent
reports (through NVSwitches too: GPUs linked to one switch are connected). When a node reports no matrix but is an 8-GPU Hopper/Ampere NVSwitch
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


def bus_key(bus_id: str) -> str:
    """A PCI bus id in one spelling: NVML's 8-digit domain and sysfs' 4-digit one compare equal."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) == 8 and domain.startswith("0000"):
        return f"{domain[4:]}:{rest}"
    return text


def _nvlink_components(gpus: Sequence[GPUInfo]) -> tuple[int, ...]:
    """Connected components of the NVLink graph.

    A peer that is not one of the node's GPUs is an NVSwitch: GPUs linked to the
    same switch are connected through it (HGX boards report only switch peers).
    """
    vertex: dict[str, int] = {}
    for slot, gpu in enumerate(gpus):
        if gpu.uuid:
            vertex[gpu.uuid.lower()] = slot
        if gpu.topology.bus_id:
            vertex[bus_key(gpu.topology.bus_id)] = slot
    parent = list(range(len(gpus)))

    def find(item: int) -> int:
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    switches: dict[str, int] = {}
    linked = [False] * len(gpus)
    for slot, gpu in enumerate(gpus):
        for peer in gpu.topology.nvlink_peers:
            if peer.links <= 0:
                continue
            other = vertex.get(peer.uuid.lower()) if peer.uuid else None
            if other is None and peer.bus_id:
                other = vertex.get(bus_key(peer.bus_id))
            if other is None:
                key = bus_key(peer.bus_id) if peer.bus_id else f"uuid:{peer.uuid}"
                if key not in switches:
                    switches[key] = len(parent)
                    parent.append(len(parent))
                other = switches[key]
            elif other == slot:
                continue
            else:
                linked[other] = True
            linked[slot] = True
            parent[find(slot)] = find(other)
    roots = [find(slot) if linked[slot] else None for slot in range(len(gpus))]
    # A GPU alone with its switch is in no group: a group needs two GPUs.
    sizes: dict[int, int] = {}
    for root in roots:
        if root is not None:
            sizes[root] = sizes.get(root, 0) + 1
    return _dense_ids([root if root is not None and sizes[root] > 1 else None for root in roots])


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
