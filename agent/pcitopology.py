"""Where a PCI device sits: NUMA node, CPU socket and PCIe root complex.

NVML does not say these; Linux does, in sysfs. `SysfsTopology` reads them
from a sysfs tree (the real /sys, or a tree a test builds); with
`--fake-nvml` the inventory supplies them through `InventoryTopology`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from agent.fakenvml_inventory import Inventory
from agent.pci_address import sysfs_bus_id


@dataclass(frozen=True)
class PciLocation:
    numa_node: int = -1
    socket_id: int = -1
    pcie_root: str = ""


class PciTopologySource(Protocol):
    def locate(self, bus_id: str) -> PciLocation: ...


class SysfsTopology:
    """Reads a device's placement from sysfs rooted at `root` (normally "/sys")."""

    def __init__(self, *, root: str = "/sys") -> None:
        self._root = root

    def locate(self, bus_id: str) -> PciLocation:
        device = os.path.join(self._root, "bus", "pci", "devices", sysfs_bus_id(bus_id))
        numa = _read_int(os.path.join(device, "numa_node"), default=-1)
        return PciLocation(numa_node=numa, socket_id=self._socket_of(numa), pcie_root=self._pcie_root(device))

    def _pcie_root(self, device: str) -> str:
        # The resolved path is .../devices/pci0000:17/0000:17:00.0/.../0000:18:00.0; the
        # first "pciDDDD:BB" component is the root complex the GPU hangs off.
        try:
            resolved = os.path.realpath(device, strict=True)
        except OSError:
            return ""
        for part in resolved.split(os.sep):
            if part.startswith("pci") and ":" in part:
                return part
        return ""

    def _socket_of(self, numa: int) -> int:
        if numa < 0:
            return -1
        cpulist = _read_text(os.path.join(self._root, "devices", "system", "node", f"node{numa}", "cpulist"))
        first = cpulist.split(",")[0].split("-")[0].strip() if cpulist else ""
        if not first.isdigit():
            return -1
        return _read_int(
            os.path.join(self._root, "devices", "system", "cpu", f"cpu{first}", "topology", "physical_package_id"),
            default=-1,
        )


class InventoryTopology:
    """The placement an inventory file states, for `--fake-nvml`."""

    def __init__(self, inventory: Inventory) -> None:
        self._by_bus = {
            sysfs_bus_id(g.bus_id): PciLocation(numa_node=g.numa_node, socket_id=g.socket_id, pcie_root=g.pcie_root)
            for g in inventory.gpus
        }

    def locate(self, bus_id: str) -> PciLocation:
        return self._by_bus.get(sysfs_bus_id(bus_id), PciLocation())


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _read_int(path: str, *, default: int) -> int:
    value = _read_text(path)
    try:
        return int(value)
    except ValueError:
        return default
