"""The fake NVML's MIG calls follow NVIDIA's rules: profiles, placements, memory, and the driver's errors."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from agent import nvmlapi
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import ProcessSpec, parse_inventory
from apis import mig

A100_40 = {"uuid": "GPU-a100-40", "name": "NVIDIA A100-SXM4-40GB", "memory": "40Gi", "busId": "00000000:07:00.0"}
A100_80 = {"uuid": "GPU-a100-80", "name": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "busId": "00000000:0F:00.0"}
H100 = {"uuid": "GPU-h100", "name": "NVIDIA H100 80GB HBM3", "memory": "80Gi", "busId": "00000000:18:00.0"}
T4 = {"uuid": "GPU-t4", "name": "Tesla T4", "memory": "15Gi", "busId": "00000000:3B:00.0"}


def fake(gpu: dict[str, object], mode: str = "enabled", instances: list[dict[str, object]] | None = None) -> FakeNVML:
    raw = dict(gpu)
    if gpu is not T4:
        raw["mig"] = {"mode": mode, "instances": instances or []}
    nvml = FakeNVML(parse_inventory({"gpus": [raw]}))
    nvml.nvmlInit()
    return nvml


def placement(start: int, size: int) -> pynvml.c_nvmlGpuInstancePlacement_t:
    p = pynvml.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return p


def possible(nvml: FakeNVML, profile_id: int) -> list[tuple[int, int]]:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, array, ctypes.byref(count))
    return [(p.start, p.size) for p in array]


def create(nvml: FakeNVML, profile_id: int, start: int, size: int) -> object:
    return nvml.nvmlDeviceCreateGpuInstanceWithPlacement(nvml.nvmlDeviceGetHandleByIndex(0), profile_id, placement(start, size))


@pytest.mark.parametrize(
    ("gpu", "index", "name", "profile_id", "slices", "memory_mib", "count"),
    [
        (A100_40, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, "1g.5gb", 19, 1, 4864, 7),
        (A100_40, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, "1g.5gb+me", 20, 1, 4864, 1),
        (A100_40, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, "1g.10gb", 15, 1, 9856, 4),
        (A100_40, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, "2g.10gb", 14, 2, 9856, 3),
        (A100_40, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, "3g.20gb", 9, 3, 19968, 2),
        (A100_40, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, "4g.20gb", 5, 4, 19968, 1),
        (A100_40, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, "7g.40gb", 0, 7, 40192, 1),
        (A100_80, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, "1g.10gb", 19, 1, 9856, 7),
        (A100_80, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, "3g.40gb", 9, 3, 40192, 2),
        (A100_80, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, "7g.80gb", 0, 7, 80896, 1),
        (H100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, "1g.20gb", 15, 1, 20096, 4),
        (H100, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, "4g.40gb", 5, 4, 40448, 1),
    ],
)
def test_profile_info_is_nvidias_table(
    gpu: dict[str, object], index: int, name: str, profile_id: int, slices: int, memory_mib: int, count: int
) -> None:
    nvml = fake(gpu)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(nvml.nvmlDeviceGetHandleByIndex(0), index)

    assert (nvmlapi.text(info.name), info.id, info.sliceCount, info.memorySizeMB, info.instanceCount) == (
        f"MIG {name}", profile_id, slices, memory_mib, count,
    )


@pytest.mark.parametrize(
    ("profile_id", "expected"),
    [
        (19, [(s, 1) for s in range(7)]),
        (15, [(0, 2), (2, 2), (4, 2), (6, 2)]),
        (14, [(0, 2), (2, 2), (4, 2)]),
        (9, [(0, 4), (4, 4)]),
        (5, [(0, 4)]),
        (0, [(0, 8)]),
    ],
)
def test_possible_placements_are_the_lgipp_listing(profile_id: int, expected: list[tuple[int, int]]) -> None:
    assert possible(fake(A100_80), profile_id) == expected


def test_placements_are_listed_whether_or_not_mig_is_on() -> None:
    assert possible(fake(A100_80, mode="disabled"), 9) == [(0, 4), (4, 4)]


@pytest.mark.parametrize(
    ("existing", "profile_id", "start", "size", "error"),
    [
        ([], 9, 2, 4, pynvml.NVMLError_InvalidArgument),  # 3g never starts at 2
        ([], 5, 4, 4, pynvml.NVMLError_InvalidArgument),  # 4g only at 0
        ([], 77, 0, 4, pynvml.NVMLError_InvalidArgument),  # no such profile id
        ([(9, 0, 4)], 5, 0, 4, pynvml.NVMLError_InsufficientResources),  # 3g at 0 holds the 4g's slices
        ([(9, 0, 4)], 19, 3, 1, pynvml.NVMLError_InsufficientResources),  # overlap with a 1g
        ([(0, 0, 8)], 19, 0, 1, pynvml.NVMLError_InsufficientResources),  # 7g takes everything
        ([(20, 0, 1)], 20, 1, 1, pynvml.NVMLError_InsufficientResources),  # one +me per GPU
        ([(5, 0, 4), (9, 4, 4)], 19, 6, 1, pynvml.NVMLError_InsufficientResources),  # 4g + 3g: 7 slices used
    ],
)
def test_create_refuses_what_the_driver_refuses(
    existing: list[tuple[int, int, int]], profile_id: int, start: int, size: int, error: type[Exception]
) -> None:
    nvml = fake(A100_80)
    for pid, s, z in existing:
        create(nvml, pid, s, z)

    with pytest.raises(error):
        create(nvml, profile_id, start, size)


def test_a_3g_at_start_4_leaves_the_4g_placeable_and_at_start_0_does_not() -> None:
    left = fake(A100_80)
    create(left, 9, 4, 4)
    create(left, 5, 0, 4)  # fits

    right = fake(A100_80)
    create(right, 9, 0, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create(right, 5, 0, 4)
    create(right, 9, 4, 4)  # the other 3g still fits


def test_a_created_instance_becomes_a_mig_device_with_its_profile_memory_and_placement() -> None:
    nvml = fake(A100_80)
    gi = create(nvml, 9, 4, 4)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    dev = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(h, nvml.nvmlDeviceGetGpuInstanceId(dev)))

    assert nvml.nvmlDeviceGetName(dev) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert nvml.nvmlDeviceGetMemoryInfo(dev).total == 40192 * 2**20
    assert nvml.nvmlDeviceGetUUID(dev).startswith("MIG-")
    assert (info.profileId, info.placement.start, info.placement.size) == (9, 4, 4)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 1


def test_destroy_order_and_in_use_are_enforced() -> None:
    nvml = fake(A100_80)
    gi = create(nvml, 14, 0, 2)
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    gi_id = nvml.nvmlDeviceGetGpuInstanceId(nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(0), 0))

    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(gi)  # its compute instance is still there
    nvml.set_usage(0, processes=(ProcessSpec(pid=7, used_memory_bytes=1, gpu_instance_id=gi_id, compute_instance_id=0),))
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(ci)  # a process runs on it
    nvml.set_usage(0, processes=())
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)

    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetGpuInstanceById(nvml.nvmlDeviceGetHandleByIndex(0), gi_id)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(0), 0)


@pytest.mark.parametrize(
    ("gpu", "mode", "error"),
    [
        (T4, "", pynvml.NVMLError_NotSupported),  # no MIG at all
        (A100_80, "disabled", pynvml.NVMLError_NotSupported),  # MIG-capable, not in MIG mode
    ],
)
def test_create_without_mig_mode_is_not_supported(gpu: dict[str, object], mode: str, error: type[Exception]) -> None:
    nvml = fake(gpu, mode=mode or "enabled")
    with pytest.raises(error):
        create(nvml, 19, 0, 1)


def test_mode_change_needs_an_idle_gpu_without_instances() -> None:
    nvml = fake(A100_80)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    gi = create(nvml, 19, 0, 1)
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_DISABLE)
    nvml.nvmlGpuInstanceDestroy(gi)

    nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_DISABLE)

    assert nvml.nvmlDeviceGetMigMode(h) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2


def test_inventory_instances_get_placements_that_fit_together() -> None:
    nvml = fake(A100_80, instances=[
        {"uuid": "MIG-a", "profile": "3g.40gb", "gpuInstanceId": 2},
        {"uuid": "MIG-b", "profile": "2g.20gb", "gpuInstanceId": 3},
        {"uuid": "MIG-c", "profile": "2g.20gb", "gpuInstanceId": 4},
    ])
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    where = {
        gi: (info.placement.start, info.placement.size)
        for gi in (2, 3, 4)
        for info in [nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(h, gi))]
    }

    assert where == {2: (4, 4), 3: (0, 2), 4: (2, 2)}


def test_lay_out_refuses_a_layout_the_hardware_cannot_hold() -> None:
    by_name = {p.name: p for p in mig.A100_80GB}
    assert mig.lay_out((by_name["4g.40gb"], by_name["4g.40gb"])) is None
    assert mig.lay_out((by_name["2g.20gb"],) * 3 + (by_name["1g.10gb"],)) is not None
