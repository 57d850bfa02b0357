"""The GPU hook's decision for each isolation backend, and its refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.admissions import GPUHeld, Hold
from agent.discovery import discover
from agent.hook import NO_ANSWER, HookRequest, HookSettings, decide
from agent.isolation.registry import IsolationPaths
from agent.pcitopology import InventoryTopology
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, encode_allocation
from apis.devices import ExternalHolder, NodeDevices
from apis.signing import allocation_annotations
from tests.agent.helpers import A100_MIG, T4, started_fake
from tests.signing_keys import signing_key, verifying

KEY = signing_key("cluster-key-for-tests")
NODE = "gpu-node-1"
POD_UID = "6f1c2d3e-4a5b-4c6d-8e7f-8091a2b3c4d5"
GiB = 2**30


def _devices(path: str = T4) -> NodeDevices:
    nvml, inventory = started_fake(path)
    return discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices


def _share(
    devices: NodeDevices, index: int, *, core: int = 50, memory: int = 4 * GiB, ratio: int = 25,
    containers: tuple[ContainerShare, ...] | None = None,
) -> GPUShare:
    """A share of GPU `index`; by default all of it goes to the container "main" (as the scheduler writes it)."""
    gpu = devices.gpus[index]
    if containers is None:
        containers = (ContainerShare("main", core, memory, ratio),)
    return GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=core, memory_bytes=memory, memory_ratio_percent=ratio,
        containers=containers,
    )


def _request(annotations: dict[str, str], *, uid: str = POD_UID) -> HookRequest:
    return HookRequest(pod_uid=uid, pod_namespace="ml", pod_name="trainer-0", container_name="main", annotations=annotations)


def _signed(*shares: GPUShare, node: str = NODE, uid: str = POD_UID) -> dict[str, str]:
    return allocation_annotations(KEY, pod_uid=uid, node_name=node, allocation=Allocation(gpus=shares))


def _settings(isolation: str) -> HookSettings:
    return HookSettings(node_name=NODE, key=verifying(KEY), isolation=isolation, paths=IsolationPaths())


def test_a_pod_without_an_allocation_gets_no_answer() -> None:
    assert decide(_request({"other": "x"}), devices=_devices(), settings=_settings(names.ISOLATION_HAMI_CORE)) == NO_ANSWER


def test_hami_core_limits_memory_and_sm_per_gpu_and_mounts_the_library() -> None:
    devices = _devices()
    annotations = _signed(_share(devices, 1, core=30, memory=3 * GiB), _share(devices, 0, core=50, memory=5 * GiB))
    decision = decide(_request(annotations), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is not None and not decision.rejection
    env = dict(decision.edits.envs)
    # GPUs are listed in PCI bus order, which is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID.
    assert env[names.NVIDIA_VISIBLE_DEVICES] == f"{devices.gpus[0].uuid},{devices.gpus[1].uuid}"
    assert env[names.CUDA_DEVICE_ORDER] == "PCI_BUS_ID"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5120m"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "3072m"
    assert (env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_1"], env["CUDA_DEVICE_SM_LIMIT"]) == ("50", "30", "30")
    assert env[names.HAMI_SHARED_CACHE] == "/usr/local/vgpu/cache/vgpu.cache"
    assert env[names.FGPU_MEMORY_BYTES] == f"{5 * GiB},{3 * GiB}"
    assert env[names.FGPU_CORE_PERCENT] == "50,30"
    assert env[names.FGPU_ISOLATION] == "hami-core"
    mounts = {m.container_path: m for m in decision.edits.mounts}
    assert mounts["/usr/local/vgpu/libvgpu.so"].host_path == "/usr/local/vgpu/libvgpu.so"
    assert mounts["/etc/ld.so.preload"].readonly
    cache = mounts["/usr/local/vgpu/cache"]
    assert cache.host_path == f"/var/lib/fgpu/hami-cache/{POD_UID}_main" and not cache.readonly
    assert cache.host_path in decision.host_dirs


def test_mps_sets_the_pipe_directory_pinned_memory_and_thread_percentage() -> None:
    devices = _devices()
    annotations = _signed(_share(devices, 2, core=40, memory=2 * GiB), _share(devices, 3, core=60, memory=GiB))
    decision = decide(_request(annotations), devices=devices, settings=_settings(names.ISOLATION_MPS))
    assert decision.edits is not None
    env = dict(decision.edits.envs)
    assert env[names.MPS_PIPE_DIRECTORY] == "/run/nvidia/mps"
    assert env[names.MPS_PINNED_MEM_LIMIT] == "0=2048M,1=1024M"
    assert env[names.MPS_ACTIVE_THREAD_PERCENTAGE] == "40"
    assert [m.host_path for m in decision.edits.mounts] == ["/run/nvidia/mps"]
    assert not any(k.startswith("CUDA_DEVICE_MEMORY_LIMIT") for k in env)


def test_none_gives_visibility_and_informative_variables_only() -> None:
    devices = _devices()
    decision = decide(_request(_signed(_share(devices, 0))), devices=devices, settings=_settings(names.ISOLATION_NONE))
    assert decision.edits is not None
    assert [k for k, _ in decision.edits.envs] == [
        names.NVIDIA_VISIBLE_DEVICES,
        names.CUDA_DEVICE_ORDER,
        names.FGPU_GPU_UUIDS,
        names.FGPU_MEMORY_BYTES,
        names.FGPU_CORE_PERCENT,
        names.FGPU_ISOLATION,
    ]
    assert decision.edits.mounts == ()


def test_whole_gpus_need_no_software_limits_under_any_backend() -> None:
    devices = _devices()
    whole = _share(devices, 0, core=100, memory=devices.gpus[0].memory_bytes, ratio=100)
    decision = decide(_request(_signed(whole)), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is not None and decision.edits.mounts == ()
    assert dict(decision.edits.envs)[names.FGPU_ISOLATION] == "none"


def test_a_mig_share_is_made_visible_by_its_mig_uuid() -> None:
    devices = _devices(A100_MIG)
    gpu = devices.gpus[1]
    share = GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=100, memory_bytes=gpu.mig_instances[1].memory_bytes,
        memory_ratio_percent=100, mig_uuid=gpu.mig_instances[1].uuid,
        containers=(ContainerShare("main", 100, gpu.mig_instances[1].memory_bytes, 100),),
    )
    decision = decide(_request(_signed(share)), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is not None
    assert dict(decision.edits.envs)[names.NVIDIA_VISIBLE_DEVICES] == gpu.mig_instances[1].uuid
    assert decision.edits.mounts == ()  # the hardware enforces the split


def test_an_unsigned_allocation_is_refused() -> None:
    devices = _devices()
    annotations = {names.DEVICE_ALLOCATED: encode_allocation(Allocation(gpus=(_share(devices, 0),)))}
    decision = decide(_request(annotations), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is None
    assert "not signed" in decision.rejection and POD_UID in decision.rejection


def test_a_tampered_allocation_is_refused() -> None:
    devices = _devices()
    annotations = _signed(_share(devices, 0, core=10))
    annotations[names.DEVICE_ALLOCATED] = encode_allocation(Allocation(gpus=(_share(devices, 0, core=100),)))
    decision = decide(_request(annotations), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is None and "does not match" in decision.rejection


def test_an_allocation_for_another_node_is_refused() -> None:
    devices = _devices()
    decision = decide(
        _request(_signed(_share(devices, 0), node="gpu-node-2")), devices=devices, settings=_settings(names.ISOLATION_NONE)
    )
    assert decision.edits is None and "gpu-node-2" in decision.rejection and "not this node" in decision.rejection


def test_an_allocation_copied_from_another_pod_is_refused() -> None:
    devices = _devices()
    stolen = _signed(_share(devices, 0), uid="00000000-1111-4222-8333-444455556666")
    decision = decide(_request(stolen), devices=devices, settings=_settings(names.ISOLATION_NONE))
    assert decision.edits is None and "does not match" in decision.rejection


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: replace(d, gpus=(replace(d.gpus[0], healthy=False, health_reason="Xid48"), *d.gpus[1:])), "unhealthy (Xid48)"),
        (lambda d: replace(d, gpus=d.gpus[1:]), "is not on this node"),
        (lambda d: replace(d, discovery_error="NVMLError_DriverNotLoaded"), "cannot use its GPUs"),
        (
            lambda d: replace(d, external_holders=(ExternalHolder(gpu_uuid=d.gpus[0].uuid, pod_uid="other", resource_name="nvidia.com/gpu"),)),
            "held by pod other through nvidia.com/gpu",
        ),
    ],
)
def test_an_allocation_that_does_not_fit_the_node_as_it_is_now_is_refused(mutate: object, message: str) -> None:
    devices = _devices()
    annotations = _signed(_share(devices, 0))
    decision = decide(_request(annotations), devices=mutate(devices), settings=_settings(names.ISOLATION_HAMI_CORE))  # type: ignore[operator]
    assert decision.edits is None
    assert message in decision.rejection


def test_more_than_a_gpu_has_is_refused() -> None:
    devices = _devices()
    annotations = _signed(_share(devices, 0, memory=devices.gpus[0].memory_bytes + GiB))
    decision = decide(_request(annotations), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is None and "more than the GPU's" in decision.rejection


def test_a_share_of_a_whole_gpu_in_mig_mode_is_refused() -> None:
    devices = _devices(A100_MIG)
    decision = decide(_request(_signed(_share(devices, 0))), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is None and "MIG mode" in decision.rejection


def _held(devices: NodeDevices, index: int, *, core: int, memory: int, pods: int = 1) -> dict[str, GPUHeld]:
    uids = frozenset(f"admitted-{i}" for i in range(pods))
    return {devices.gpus[index].uuid: GPUHeld(core_percent=core, memory_bytes=memory, pods=uids)}


def test_a_share_that_fits_next_to_the_admitted_pods_is_admitted_with_its_holds() -> None:
    devices = _devices()
    share = replace(_share(devices, 0, core=40, memory=4 * GiB), uuid="")  # named by minor only
    decision = decide(
        _request(_signed(share)), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE),
        held=_held(devices, 0, core=60, memory=4 * GiB),
    )
    assert decision.edits is not None and not decision.rejection
    assert decision.holds == (Hold(gpu_uuid=devices.gpus[0].uuid, core_percent=40, memory_bytes=4 * GiB),)


@pytest.mark.parametrize(
    ("core", "memory", "held_core", "held_memory"),
    [(50, GiB, 60, GiB), (10, 8 * GiB, 10, 8 * GiB)],
    ids=["compute", "memory"],
)
def test_a_pod_that_would_overcommit_a_gpu_next_to_admitted_pods_is_refused(
    core: int, memory: int, held_core: int, held_memory: int
) -> None:
    devices = _devices()
    gpu = devices.gpus[1]
    assert memory + held_memory > gpu.memory_bytes or core + held_core > 100
    decision = decide(
        _request(_signed(_share(devices, 1, core=core, memory=memory))), devices=devices,
        settings=_settings(names.ISOLATION_HAMI_CORE), held=_held(devices, 1, core=held_core, memory=held_memory, pods=2),
    )
    assert decision.edits is None and decision.holds == ()
    assert f"GPU {gpu.uuid}" in decision.rejection
    assert f"{held_core}% and {held_memory} bytes held by 2 pod(s) already admitted" in decision.rejection


def test_a_mig_instance_another_pod_holds_is_refused() -> None:
    devices = _devices(A100_MIG)
    gpu = devices.gpus[1]
    mig = gpu.mig_instances[1]
    share = GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=100, memory_bytes=mig.memory_bytes,
        memory_ratio_percent=100, mig_uuid=mig.uuid, containers=(ContainerShare("main", 100, mig.memory_bytes, 100),),
    )
    held = {gpu.uuid: GPUHeld(mig={mig.uuid: frozenset({"other-pod"})})}
    decision = decide(_request(_signed(share)), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE), held=held)
    assert decision.edits is None
    assert f"MIG instance {mig.uuid} is already held by 1 pod(s) already admitted on this node (other-pod)" in decision.rejection


def test_a_share_given_only_as_a_ratio_is_limited_to_that_ratio_of_the_gpus_memory() -> None:
    # Koordinator may write gpu-core and gpu-memory-ratio without gpu-memory; the codec reads 0 bytes.
    devices = _devices()
    gpu = devices.gpus[0]
    decision = decide(
        _request(_signed(_share(devices, 0, core=50, memory=0, ratio=25))), devices=devices,
        settings=_settings(names.ISOLATION_HAMI_CORE),
    )
    assert decision.edits is not None and not decision.rejection
    env = dict(decision.edits.envs)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{gpu.memory_bytes * 25 // 100 // 2**20}m"
    assert env[names.FGPU_MEMORY_BYTES] == str(gpu.memory_bytes * 25 // 100)
    assert [h.memory_bytes for h in decision.holds] == [gpu.memory_bytes * 25 // 100]


def test_a_share_with_less_than_a_mebibyte_of_memory_is_refused_rather_than_left_unlimited() -> None:
    devices = _devices()
    decision = decide(
        _request(_signed(_share(devices, 0, core=50, memory=512 * 1024, ratio=0))), devices=devices,
        settings=_settings(names.ISOLATION_HAMI_CORE),
    )
    assert decision.rejection and "under 1 MiB" in decision.rejection
