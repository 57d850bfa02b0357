"""The agent reports what NVML can place: profiles, legal placements, and where each instance sits."""

from __future__ import annotations

import pynvml

from agent.discovery import discover
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import parse_inventory
from agent.pcitopology import InventoryTopology
from apis import mig
from apis.devices import from_device_object, from_proto, to_device_object, to_proto


def inventory(mode: str | None) -> dict[str, object]:
    gpu: dict[str, object] = {"uuid": "GPU-0", "name": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "busId": "00000000:07:00.0"}
    if mode is not None:
        gpu["mig"] = {"mode": mode}
    return {"gpus": [gpu]}



def test_a_mig_capable_gpu_reports_nvidias_profiles_and_placements_in_or_out_of_mig_mode() -> None:
    for mode in ("enabled", "disabled"):
        raw = inventory(mode)
        nvml = FakeNVML(parse_inventory(raw))
        nvml.nvmlInit()
        gpu = discover(nvml, node_name="n", topology=InventoryTopology(parse_inventory(raw))).devices.gpus[0]

        assert sorted(gpu.mig_profiles, key=lambda p: p.name) == sorted(mig.A100_80GB, key=lambda p: p.name)
        assert gpu.mig_enabled is (mode == "enabled")


def test_a_gpu_without_mig_reports_no_profiles() -> None:
    raw = inventory(None)
    nvml = FakeNVML(parse_inventory(raw))
    nvml.nvmlInit()

    assert discover(nvml, node_name="n", topology=InventoryTopology(parse_inventory(raw))).devices.gpus[0].mig_profiles == ()


def test_an_instance_is_reported_with_its_profile_and_placement_through_both_wire_forms() -> None:
    raw = inventory("enabled")
    nvml = FakeNVML(parse_inventory(raw))
    nvml.nvmlInit()
    where = pynvml.c_nvmlGpuInstancePlacement_t()
    where.start, where.size = 4, 4
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(nvml.nvmlDeviceGetHandleByIndex(0), 9, where)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)

    devices = discover(nvml, node_name="n", topology=InventoryTopology(parse_inventory(raw))).devices
    (instance,) = devices.gpus[0].mig_instances

    assert (instance.profile, instance.profile_id, instance.placement_start, instance.placement_size) == ("3g.40gb", 9, 4, 4)
    assert from_proto(to_proto(devices)) == devices
    assert from_device_object(to_device_object(devices)) == devices


def test_the_dynamic_mig_example_node_has_no_fgpu_instances_and_room_for_a_7g() -> None:
    from pathlib import Path

    from agent.fakenvml_inventory import load_inventory

    path = Path(__file__).parents[2] / "examples" / "inventories" / "a100-2x-mig-dynamic.yaml"
    inv = load_inventory(str(path))
    nvml = FakeNVML(inv)
    nvml.nvmlInit()
    gpus = discover(nvml, node_name="n", topology=InventoryTopology(inv)).devices.gpus

    assert [len(g.mig_instances) for g in gpus] == [0, 1]
    assert all(g.mig_enabled and len(g.mig_profiles) == 7 for g in gpus)
    assert gpus[1].mig_instances[0].placement_size > 0 and not gpus[1].mig_instances[0].fgpu_created


def test_a_gpu_instance_without_a_compute_instance_is_reported_taken_with_no_uuid() -> None:
    # `nvidia-smi mig -cgi 9` without -C: NVML refuses any create overlapping slices 4..7, so the report must show them.
    raw = inventory("enabled")
    nvml = FakeNVML(parse_inventory(raw))
    nvml.nvmlInit()
    where = pynvml.c_nvmlGpuInstancePlacement_t()
    where.start, where.size = 4, 4
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(nvml.nvmlDeviceGetHandleByIndex(0), 9, where)
    where.start, where.size = 0, 1
    nvml.nvmlGpuInstanceCreateComputeInstance(
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(nvml.nvmlDeviceGetHandleByIndex(0), 19, where),
        pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    )

    found = discover(nvml, node_name="n", topology=InventoryTopology(parse_inventory(raw)))
    instances = found.devices.gpus[0].mig_instances

    assert [(m.profile, m.placement_start, m.placement_size, bool(m.uuid)) for m in instances] == [
        ("1g.10gb", 0, 1, True), ("3g.40gb", 4, 4, False),
    ]
    empty = instances[1]
    assert (empty.slices, empty.memory_bytes, empty.profile_id, empty.index) == (3, 40192 * 2**20, 9, -1)
    assert "" not in found.mig_parents and "" not in found.handles
    assert from_device_object(to_device_object(found.devices)).gpus[0].mig_instances == instances

    # once the operator adds the compute instance, the same GPU instance is reported once, with its UUID
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    again = discover(nvml, node_name="n", topology=InventoryTopology(parse_inventory(raw))).devices.gpus[0]
    assert [(m.profile, m.placement_start, bool(m.uuid)) for m in again.mig_instances] == [
        ("1g.10gb", 0, True), ("3g.40gb", 4, True),
    ]
