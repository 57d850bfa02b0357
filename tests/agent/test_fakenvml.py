"""The fake NVML behaves as pynvml does where the agent relies on it."""

from __future__ import annotations

import pynvml
import pytest

from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from tests.agent.helpers import A100_MIG, T4, started_fake


def test_calls_before_init_raise_the_real_uninitialized_error() -> None:
    nvml = FakeNVML(load_inventory(T4))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_a_scripted_init_failure_raises_the_real_pynvml_class() -> None:
    nvml = FakeNVML(load_inventory(T4))
    nvml.set_init_error("LibraryNotFound")
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        nvml.nvmlInit()
    nvml.set_init_error("")
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 4


def test_shutdown_ends_the_session_like_the_library_refcount() -> None:
    nvml, _ = started_fake(T4)
    nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_structures_are_the_real_pynvml_ctypes_types() -> None:
    nvml, inventory = started_fake(T4)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    pci = nvml.nvmlDeviceGetPciInfo_v3(handle)
    assert isinstance(pci, pynvml.nvmlPciInfo_t)
    assert pci.busId == inventory.gpus[0].bus_id
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(memory, pynvml.c_nvmlMemory_t)
    assert memory.total == inventory.gpus[0].memory_bytes


def test_mig_calls_on_a_gpu_without_mig_raise_not_supported() -> None:
    nvml, _ = started_fake(T4)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(handle, 0)


def test_an_empty_mig_slot_raises_not_found() -> None:
    nvml, inventory = started_fake(A100_MIG)
    handle = nvml.nvmlDeviceGetHandleByIndex(2)  # one 7g.80gb instance
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert nvml.nvmlDeviceGetUUID(mig) == inventory.gpus[2].mig_instances[0].uuid
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 1)


def test_a_lost_gpu_raises_gpu_is_lost_on_lookup_and_on_old_handles() -> None:
    nvml, _ = started_fake(T4)
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.set_lost(1, True)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetMemoryInfo(handle)


def test_an_event_wait_with_nothing_due_times_out_with_the_real_error() -> None:
    nvml, _ = started_fake(T4)
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, event_set)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(event_set, 10)


def test_an_injected_xid_arrives_only_on_a_set_registered_for_its_gpu() -> None:
    nvml, _ = started_fake(T4)
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, event_set)
    nvml.inject_xid(1, 48)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(event_set, 10)
    nvml.inject_xid(0, 48)
    event = nvml.nvmlEventSetWait_v2(event_set, 1000)
    assert (event.eventType, event.eventData, nvml.nvmlDeviceGetUUID(event.device)) == (
        pynvml.nvmlEventTypeXidCriticalError,
        48,
        nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0)),
    )


def test_xid_79_takes_the_gpu_off_the_bus() -> None:
    nvml, _ = started_fake(T4)
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(3), pynvml.nvmlEventTypeXidCriticalError, event_set)
    nvml.inject_xid(3, 79)
    nvml.nvmlEventSetWait_v2(event_set, 1000)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(3)


def test_processes_come_back_as_pynvml_friendly_objects() -> None:
    nvml, _ = started_fake(T4)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(0))
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(41230, 4 * 2**30), (41231, 2 * 2**30)]
    assert all(isinstance(p, pynvml.nvmlFriendlyObject) for p in procs)


def test_scripted_inventory_events_arrive_after_their_delay() -> None:
    from agent.fakenvml_inventory import parse_inventory

    inventory = parse_inventory(
        {
            "gpus": [{"uuid": "GPU-00000000-0000-4000-8000-000000000001", "name": "Tesla T4", "memory": "15Gi",
                      "busId": "00000000:3B:00.0"}],
            "events": [{"gpu": 0, "xid": 48, "after": "0.05s"}],
        }
    )
    nvml = FakeNVML(inventory)
    nvml.nvmlInit()
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, event_set)
    assert nvml.nvmlEventSetWait_v2(event_set, 2000).eventData == 48
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(event_set, 10)
