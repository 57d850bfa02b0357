"""Held-out review of dynamic MIG against NVIDIA's documented profiles and placement rules.

Sources: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles" (per-product tables:
A30-24GB, A100-40/80GB, H100-80GB, H100-94GB/NVL, H100-96GB, H200-141GB, ...) and
"Getting Started with MIG" (GPU instances are created with or without compute instances:
`nvidia-smi mig -cgi` without `-C` leaves a GPU instance with none);
<https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html>.
nvml.h: `nvmlDeviceGetGpuInstancePossiblePlacements` ("creation of new GPU instance will fail
if there is overlap with the already occupied memory slices").

Each test is a defect found by this review, marked strict xfail until its fix lands.
"""

from __future__ import annotations

import pynvml
import pytest

from agent import nvmlapi
from agent.discovery import discover
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import parse_inventory
from agent.pcitopology import InventoryTopology
from apis import mig
from apis.inventory import GPUInfo, MIGInstance
from scheduler_plugin.core import mig_placement
from scheduler_plugin.core.mig_placement import GPUSlot

GiB = 2**30
MiB = 2**20
A100_80: dict[str, object] = {"uuid": "GPU-0", "name": "NVIDIA A100-SXM4-80GB", "memory": "80Gi", "busId": "00000000:07:00.0"}


def _fake(gpu: dict[str, object]) -> tuple[FakeNVML, dict[str, object]]:
    raw: dict[str, object] = {"gpus": [{**gpu, "mig": {"mode": "enabled"}}]}
    nvml = FakeNVML(parse_inventory(raw))
    nvml.nvmlInit()
    return nvml, raw


def _placement(start: int, size: int) -> pynvml.c_nvmlGpuInstancePlacement_t:
    p = pynvml.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return p


# --- 1. a GPU instance without a compute instance is invisible to the scheduler ------------------


def test_an_operators_gpu_instance_without_a_compute_instance_is_not_handed_out_again() -> None:
    # An operator ran `nvidia-smi mig -cgi 9` (no -C): a 3g.40gb GPU instance at memory slices 4..7, no
    # compute instance yet. NVML refuses any overlapping create; the scheduler must not pick one.
    nvml, raw = _fake(A100_80)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, _placement(4, 4))

    gpu = discover(nvml, node_name="n", topology=InventoryTopology(parse_inventory(raw))).devices.gpus[0]
    choice = mig_placement.choose([GPUSlot(0, gpu, frozenset(), ())], [30 * GiB])

    assert choice is not None and choice.uuid == ""
    profile = next(p for p in gpu.mig_profiles if p.name == choice.profile)
    where = next(p for p in profile.placements if p.start == choice.placement_start)
    try:  # what the agent's prepare does with the allocation; today: 3g.40gb at 4, InsufficientResources
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.profile_id, _placement(where.start, where.size))
    except nvmlapi.NVMLError as err:
        pytest.fail(f"the scheduler chose {choice.profile} at memory slice {choice.placement_start}, which NVML refuses: {err!r}")


# --- 2. the fake NVML gives 94 GB H100s the 80 GB table -------------------------------------------


def test_a_94gb_h100_is_not_given_the_80gb_profiles() -> None:
    model = "NVIDIA H100 NVL"  # 94 GB HBM3 (nvidia-smi: 95830 MiB)
    table = mig.profiles_for_model(model, 95830 * MiB)
    names = {p.name for p in table}
    # either no table (docs/mig.md: "H100-94/96GB ... have no table here") or NVIDIA's 94 GB one
    assert not table or "7g.94gb" in names, f"{model} with 94 GB got {sorted(names)}"


# --- 3. the placement rule keeps room for profiles fgpu never creates ------------------------------


def _one_gpu(instances: tuple[MIGInstance, ...]) -> GPUInfo:
    return GPUInfo(
        uuid="GPU-0", minor=0, index=0, model="NVIDIA A100-SXM4-80GB", model_label="A100-SXM4-80GB",
        memory_bytes=80 * GiB, mig_enabled=True, mig_instances=instances, mig_profiles=mig.A100_80GB,
    )


def test_pods_that_fit_one_gpu_together_all_get_an_instance() -> None:
    # 5, 5, 15 and 30 GiB: 1g.10gb, 1g.10gb, 1g.20gb, 3g.40gb = 6 compute and 8 memory slices, which
    # NVIDIA's placements hold together (3g@0, 1g@4, 1g@5, 1g.20gb@6). Each pod is scheduled in turn and
    # its instance made before the next arrives.
    by_name = {p.name: p for p in mig.A100_80GB}
    needs = [5, 5, 15, 30]
    assert mig.lay_out(tuple(by_name[n] for n in ("1g.10gb", "1g.10gb", "1g.20gb", "3g.40gb"))) is not None

    made: list[MIGInstance] = []
    for k, need in enumerate(needs):
        gpu = _one_gpu(tuple(made))
        choice = mig_placement.choose([GPUSlot(0, gpu, frozenset(m.uuid for m in made), ())], [need * GiB])
        assert choice is not None, (
            f"pod {k} ({need} GiB) gets no instance; the GPU holds "
            f"{[(m.profile, m.placement_start) for m in made]}"
        )
        p = by_name[choice.profile]
        made.append(MIGInstance(
            uuid=f"MIG-{k}", profile=p.name, memory_bytes=p.memory_bytes, slices=p.slices, profile_id=p.profile_id,
            placement_start=choice.placement_start, placement_size=p.placements[0].size, fgpu_created=True,
        ))
