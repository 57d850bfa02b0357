"""Discovery when one GPU's NVML calls fail: that GPU is reported unhealthy (or left out), the others as usual."""

from __future__ import annotations

import logging
from typing import Any

import pynvml
import pytest

from agent.discovery import discover
from agent.fakenvml import FakeHandle, FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.pcitopology import InventoryTopology
from tests.agent.helpers import T4


def _failing_fake(
    gpu_index: int, call: str, error: str, *, except_calls: tuple[str, ...] = (), base: type[FakeNVML] = FakeNVML
) -> FakeNVML:
    """The T4 fake, started, where `call` on GPU `gpu_index` raises NVMLError_<error>.

    `call="*"` fails every per-GPU call but those in `except_calls` (a GPU lost after NVML cached its UUID).
    """

    class Failing(base):  # type: ignore[valid-type,misc]
        def __getattribute__(self, name: str) -> Any:
            attr = super().__getattribute__(name)
            if not name.startswith("nvmlDevice") or name in except_calls or (call != "*" and name != call):
                return attr

            def broken(*args: Any, **kwargs: Any) -> Any:
                first = args[0] if args else None
                if first == gpu_index or (isinstance(first, FakeHandle) and first.gpu_index == gpu_index):
                    raise getattr(pynvml, f"NVMLError_{error}")()
                return attr(*args, **kwargs)

            return broken

    nvml = Failing(load_inventory(T4))
    nvml.nvmlInit()
    return nvml


def _discover(nvml: FakeNVML, **kwargs: Any) -> Any:
    return discover(nvml, node_name="n", topology=InventoryTopology(load_inventory(T4)), **kwargs)


@pytest.mark.parametrize(("call", "error", "fix"), [
    ("nvmlDeviceGetMemoryInfo", "NotSupported", "unified-memory"),
    ("nvmlDeviceGetName", "NoPermission", "/dev/nvidia1"),
    ("nvmlDeviceGetPciInfo_v3", "InsufficientPower", "nvidia-smi -i 1"),
])
def test_a_gpu_with_a_failing_query_is_reported_unhealthy_with_the_error_and_the_fix(
    call: str, error: str, fix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent.discovery")
    found = _discover(_failing_fake(1, call, error))
    gpus = found.devices.gpus
    assert [(g.index, g.healthy) for g in gpus] == [(0, True), (1, False), (2, True), (3, True)]
    assert not found.devices.discovery_error
    reason = gpus[1].health_reason
    assert reason.startswith("unreadable: ") and f"NVMLError_{error}" in reason and "index 1" in reason
    assert fix in reason
    assert gpus[1].minor == 1  # what the GPU still answers is kept
    assert gpus[1].uuid in found.handles  # the usage loop keeps checking it
    assert any(gpus[1].uuid in r.getMessage() and "index 1" in r.getMessage() for r in caplog.records)


def test_a_gpu_whose_handle_is_refused_is_left_out_and_the_log_names_its_index(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agent.discovery")
    found = _discover(_failing_fake(2, "nvmlDeviceGetHandleByIndex", "NoPermission"))
    assert [g.index for g in found.devices.gpus] == [0, 1, 3]
    assert all(g.healthy for g in found.devices.gpus) and not found.devices.discovery_error
    assert any("GPU index 2" in r.getMessage() and "NoPermission" in r.getMessage() for r in caplog.records)


def test_a_gpu_lost_after_an_earlier_discovery_keeps_its_known_facts() -> None:
    before = {g.uuid: g for g in _discover(_failing_fake(9, "*", "GpuIsLost")).devices.gpus}
    lost = _failing_fake(0, "*", "GpuIsLost", except_calls=("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"))
    gpu = _discover(lost, known=before).devices.gpus[0]
    known = next(iter(before.values()))
    assert (gpu.uuid, gpu.minor, gpu.memory_bytes, gpu.model, gpu.topology) == (
        known.uuid, known.minor, known.memory_bytes, known.model, known.topology
    )
    assert not gpu.healthy and gpu.health_reason.startswith("lost: NVMLError_GpuIsLost")


def test_a_lost_gpu_never_seen_before_yields_a_guessed_minor_to_a_gpu_that_has_it() -> None:
    # Nothing answers on GPU 0 but its UUID: its minor can only be guessed (its index, 0) ...
    lost = _failing_fake(0, "*", "GpuIsLost", except_calls=("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"))
    gpus = _discover(lost).devices.gpus
    assert [(g.index, g.minor, g.healthy) for g in gpus] == [(0, 0, False), (1, 1, True), (2, 2, True), (3, 3, True)]

    # ... and when another GPU really is /dev/nvidia0, the guess gives way: the lost GPU is left out.
    class MinorsShifted(FakeNVML):
        def nvmlDeviceGetMinorNumber(self, handle: FakeHandle) -> int:
            return (super().nvmlDeviceGetMinorNumber(handle) + 3) % 4  # GPU 1 is /dev/nvidia0

    shifted = _failing_fake(
        0, "*", "GpuIsLost", except_calls=("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"), base=MinorsShifted
    )
    found = _discover(shifted)
    assert [(g.index, g.minor) for g in found.devices.gpus] == [(1, 0), (2, 1), (3, 2)]
    minors = [g.minor for g in found.devices.gpus]
    assert len(set(minors)) == len(minors)
    assert set(found.handles) == {g.uuid for g in found.devices.gpus}


@pytest.mark.parametrize("error", ["DriverNotLoaded", "Uninitialized", "LibRmVersionMismatch"])
def test_nvml_itself_failing_on_one_gpus_call_fails_the_whole_discovery(error: str) -> None:
    # The driver went away mid-discovery: not this GPU's problem, and the poll loop must start NVML over.
    with pytest.raises(getattr(pynvml, f"NVMLError_{error}")):
        _discover(_failing_fake(1, "nvmlDeviceGetHandleByIndex", error))
    with pytest.raises(getattr(pynvml, f"NVMLError_{error}")):
        _discover(_failing_fake(1, "nvmlDeviceGetMemoryInfo", error))
