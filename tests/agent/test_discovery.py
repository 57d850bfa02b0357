"""Discovery through the production NVML code path, on every example inventory."""

from __future__ import annotations

import os

import pytest

from agent.discovery import discover, mig_profile
from agent.pcitopology import InventoryTopology, SysfsTopology
from tests.agent.helpers import A100_MIG, ALL_INVENTORIES, H100, MIXED, T4, started_fake


@pytest.mark.parametrize("path", ALL_INVENTORIES)
def test_discovery_reports_every_gpu_of_every_example_inventory(path: str) -> None:
    nvml, inventory = started_fake(path)
    found = discover(nvml, node_name="node-a", topology=InventoryTopology(inventory)).devices
    assert [g.uuid for g in found.gpus] == [g.uuid for g in inventory.gpus]
    assert [g.memory_bytes for g in found.gpus] == [g.memory_bytes for g in inventory.gpus]
    assert [g.topology.numa_node for g in found.gpus] == [g.numa_node for g in inventory.gpus]
    assert [g.topology.pcie_root for g in found.gpus] == [g.pcie_root for g in inventory.gpus]
    assert found.node_name == "node-a"
    assert found.driver_version == inventory.driver_version
    assert all(g.healthy for g in found.gpus)


def test_h100_gpus_report_their_nvswitches_as_nvlink_peers_with_link_counts() -> None:
    nvml, inventory = started_fake(H100)
    found = discover(nvml, node_name="n", topology=InventoryTopology(inventory)).devices
    gpu = found.gpus[0]
    assert gpu.model == "NVIDIA H100 80GB HBM3" and gpu.model_label == "H100-80GB-HBM3"
    assert [(p.bus_id, p.links, p.uuid) for p in gpu.topology.nvlink_peers] == [
        ("00000000:05:00.0", 5, ""),
        ("00000000:06:00.0", 4, ""),
        ("00000000:07:00.0", 4, ""),
        ("00000000:08:00.0", 5, ""),
    ]
    assert found.cuda_driver_version == "12.4"


def test_t4_gpus_have_no_nvlink_and_no_mig() -> None:
    nvml, inventory = started_fake(T4)
    found = discover(nvml, node_name="n", topology=InventoryTopology(inventory)).devices
    assert all(not g.topology.nvlink_peers and not g.mig_enabled for g in found.gpus)
    assert {g.model_label for g in found.gpus} == {"T4"}


def test_mig_instances_are_reported_with_profile_memory_and_slices() -> None:
    nvml, inventory = started_fake(A100_MIG)
    found = discover(nvml, node_name="n", topology=InventoryTopology(inventory))
    gpu1 = found.devices.gpus[1]
    assert gpu1.mig_enabled
    assert [(m.profile, m.slices, m.memory_bytes // 2**20, m.gpu_instance_id) for m in gpu1.mig_instances] == [
        ("3g.40gb", 3, 40192, 2),
        ("2g.20gb", 2, 19968, 3),
        ("2g.20gb", 2, 19968, 4),
    ]
    assert [m.index for m in gpu1.mig_instances] == [0, 1, 2]
    assert all(found.mig_parents[m.uuid] == gpu1.uuid for m in gpu1.mig_instances)
    assert all(m.uuid in found.handles for m in gpu1.mig_instances)


def test_a_node_mixing_mig_and_non_mig_gpus_reports_each_as_it_is() -> None:
    nvml, inventory = started_fake(MIXED)
    gpus = discover(nvml, node_name="n", topology=InventoryTopology(inventory)).devices.gpus
    assert [(g.mig_enabled, len(g.mig_instances)) for g in gpus] == [(True, 7), (False, 0), (False, 0)]
    # The NVLink bridge peers are GPUs on this node, so they are named by UUID.
    assert gpus[0].topology.nvlink_peers[0].uuid == gpus[1].uuid
    assert gpus[1].topology.nvlink_peers[0].uuid == gpus[0].uuid


def test_a_gpu_that_is_lost_before_discovery_is_left_out_and_the_rest_reported() -> None:
    nvml, inventory = started_fake(T4)
    nvml.set_lost(2, True)
    gpus = discover(nvml, node_name="n", topology=InventoryTopology(inventory)).devices.gpus
    assert [g.index for g in gpus] == [0, 1, 3]


def test_the_mig_profile_is_rebuilt_from_attributes_when_the_name_has_none() -> None:
    class Attrs:
        gpuInstanceSliceCount = 3
        computeInstanceSliceCount = 1
        memorySizeMB = 40192

    assert mig_profile("NVIDIA A100-SXM4-80GB MIG 3g.40gb", Attrs()) == "3g.40gb"
    assert mig_profile("", Attrs()) == "1c.3g.39gb"


def _sysfs(tmp: str) -> str:
    """A sysfs tree with one GPU at 0000:18:00.0 under root pci0000:17, NUMA node 1, socket 1."""
    device_dir = os.path.join(tmp, "devices", "pci0000:17", "0000:17:00.0", "0000:18:00.0")
    os.makedirs(device_dir)
    with open(os.path.join(device_dir, "numa_node"), "w") as f:
        f.write("1\n")
    os.makedirs(os.path.join(tmp, "bus", "pci", "devices"))
    os.symlink(device_dir, os.path.join(tmp, "bus", "pci", "devices", "0000:18:00.0"))
    node = os.path.join(tmp, "devices", "system", "node", "node1")
    os.makedirs(node)
    with open(os.path.join(node, "cpulist"), "w") as f:
        f.write("32-63,96-127\n")
    topo = os.path.join(tmp, "devices", "system", "cpu", "cpu32", "topology")
    os.makedirs(topo)
    with open(os.path.join(topo, "physical_package_id"), "w") as f:
        f.write("1\n")
    return tmp


def test_sysfs_gives_numa_node_socket_and_pcie_root_from_nvml_bus_ids(tmp_path: object) -> None:
    topology = SysfsTopology(root=_sysfs(str(tmp_path)))
    where = topology.locate("00000000:18:00.0")
    assert (where.numa_node, where.socket_id, where.pcie_root) == (1, 1, "pci0000:17")


def test_a_device_missing_from_sysfs_has_unknown_placement(tmp_path: object) -> None:
    where = SysfsTopology(root=_sysfs(str(tmp_path))).locate("00000000:AF:00.0")
    assert (where.numa_node, where.socket_id, where.pcie_root) == (-1, -1, "")
