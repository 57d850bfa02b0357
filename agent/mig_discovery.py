"""What NVML can place on a MIG-capable GPU: its profiles, their legal placements, where instances sit.

Read through the `agent.nvmlapi.NVML` calls, so the same code runs against the
driver and the fake. A GPU without MIG answers NotSupported and gets no profiles;
a profile index the GPU lacks is skipped the same way.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import pynvml

from agent import nvmlapi
from agent.nvmlapi import NVML
from apis.mig import MIGPlacement, MIGProfile

log = logging.getLogger(__name__)


def read_profiles(nvml: NVML, handle: Any) -> tuple[MIGProfile, ...]:
    """Every GPU instance profile of the GPU with its possible placements; () on a GPU without MIG."""
    profiles = []
    for index in range(nvmlapi.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except (nvmlapi.NVMLError_NotSupported, nvmlapi.NVMLError_InvalidArgument):
            continue
        except nvmlapi.GPU_GONE_ERRORS:
            raise
        except nvmlapi.NVMLError as err:
            log.debug("MIG profile index %d: %s", index, nvmlapi.error_text(err))
            continue
        profile_id = int(info.id)
        profiles.append(
            MIGProfile(
                name=_profile_name(info),
                profile_id=profile_id,
                slices=int(info.sliceCount),
                memory_bytes=int(info.memorySizeMB) * 2**20,
                instance_count=int(info.instanceCount),
                placements=possible_placements(nvml, handle, profile_id),
                multiprocessors=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                jpegs=int(info.jpegCount),
                ofas=int(info.ofaCount),
                nvml_index=index,
            )
        )
    return tuple(profiles)


def possible_placements(nvml: NVML, handle: Any, profile_id: int) -> tuple[MIGPlacement, ...]:
    count = ctypes.c_uint(0)
    try:
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
        array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    except nvmlapi.GPU_GONE_ERRORS:
        raise
    except nvmlapi.NVMLError as err:
        log.warning("MIG profile %d: no placements (%s); fgpu creates none of it", profile_id, nvmlapi.error_text(err))
        return ()
    return tuple(MIGPlacement(int(p.start), int(p.size)) for p in array[: count.value])


def instance_placement(nvml: NVML, handle: Any, gpu_instance_id: int) -> tuple[int, MIGPlacement] | None:
    """(profile id, placement) of a GPU instance, None when NVML does not say."""
    try:
        info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id))
    except nvmlapi.GPU_GONE_ERRORS:
        raise
    except nvmlapi.NVMLError as err:
        log.debug("GPU instance %d: no placement (%s)", gpu_instance_id, nvmlapi.error_text(err))
        return None
    return int(info.profileId), MIGPlacement(int(info.placement.start), int(info.placement.size))


#: GPU instance ids NVML hands out on A100/H100 (0 for a 7g, up to 14 for 1g instances).
MAX_GPU_INSTANCE_ID = 15


def gpu_instances(nvml: NVML, handle: Any) -> list[tuple[int, int, MIGPlacement]]:
    """(GPU instance id, profile id, placement) of every GPU instance on the GPU, with or without a compute instance.

    The MIG devices list only GPU instances that hold a compute instance; one made with
    `nvidia-smi mig -cgi` without `-C`, or left half-made, still takes its memory slices.
    """
    out = []
    for gi_id in range(MAX_GPU_INSTANCE_ID):
        found = instance_placement(nvml, handle, gi_id)
        if found is not None:
            out.append((gi_id, *found))
    return out


def _profile_name(info: Any) -> str:
    """ "MIG 3g.40gb" (the v2 struct's name) -> "3g.40gb"; rebuilt from slices and memory without one."""
    name = nvmlapi.text(getattr(info, "name", b"") or b"").strip()
    if name.startswith("MIG "):
        return name[4:]
    return name or f"{int(info.sliceCount)}g.{max(1, round(int(info.memorySizeMB) / 1024))}gb"
