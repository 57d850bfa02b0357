"""What each isolation backend enforces for a burstable share, from the signed limit, never the pod's annotations."""

from __future__ import annotations

from agent.admissions import GPUHeld
from agent.discovery import discover
from agent.hook import HookRequest, HookSettings, decide
from agent.isolation.registry import IsolationPaths
from agent.pcitopology import InventoryTopology
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, ShareLimit
from apis.devices import NodeDevices
from apis.signing import allocation_annotations
from tests.agent.helpers import T4, started_fake
from tests.signing_keys import signing_key, verifying

KEY = signing_key("cluster-key-for-tests")
NODE = "gpu-node-1"
POD_UID = "11111111-2222-4333-8444-555555555555"
GiB = 2**30


def _devices() -> NodeDevices:
    nvml, inventory = started_fake(T4)
    return discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices


def _burstable(devices: NodeDevices, *, limit: ShareLimit | None) -> dict[str, str]:
    gpu = devices.gpus[0]
    share = GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=20, memory_bytes=2 * GiB, memory_ratio_percent=13,
        containers=(ContainerShare("main", 20, 2 * GiB, 13),), limit=limit,
    )
    return allocation_annotations(KEY, pod_uid=POD_UID, node_name=NODE, allocation=Allocation(gpus=(share,)))


def _decide(annotations: dict[str, str], isolation: str, devices: NodeDevices, **kwargs: object) -> object:
    request = HookRequest(pod_uid=POD_UID, pod_namespace="ml", pod_name="infer-0", container_name="main",
                          annotations=annotations)
    settings = HookSettings(node_name=NODE, key=verifying(KEY), isolation=isolation, paths=IsolationPaths())
    return decide(request, devices=devices, settings=settings, **kwargs)  # type: ignore[arg-type]


LIMIT = ShareLimit(core_percent=60, memory_bytes=8 * GiB, memory_ratio_percent=50)


def test_hami_core_caps_memory_at_the_limit_and_compute_at_the_core_limit() -> None:
    devices = _devices()
    decision = _decide(_burstable(devices, limit=LIMIT), names.ISOLATION_HAMI_CORE, devices)
    env = dict(decision.edits.envs)  # type: ignore[attr-defined]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "8192m"
    assert env["CUDA_DEVICE_SM_LIMIT_0"] == env["CUDA_DEVICE_SM_LIMIT"] == "60"
    assert env[names.HAMI_OVERSUBSCRIBE] == "false"
    # The informative variables still say what is reserved.
    assert env[names.FGPU_MEMORY_BYTES] == str(2 * GiB)


def test_mps_pins_memory_at_the_limit_and_threads_at_the_request() -> None:
    devices = _devices()
    decision = _decide(_burstable(devices, limit=LIMIT), names.ISOLATION_MPS, devices)
    env = dict(decision.edits.envs)  # type: ignore[attr-defined]
    assert env[names.MPS_PINNED_MEM_LIMIT] == "0=8192M"
    assert env[names.MPS_ACTIVE_THREAD_PERCENTAGE] == "20"


def test_none_refuses_a_burstable_share_but_not_a_guaranteed_one() -> None:
    devices = _devices()
    refused = _decide(_burstable(devices, limit=LIMIT), names.ISOLATION_NONE, devices)
    assert refused.edits is None  # type: ignore[attr-defined]
    assert "burstable" in refused.rejection and "'none'" in refused.rejection  # type: ignore[attr-defined]
    guaranteed = _decide(_burstable(devices, limit=None), names.ISOLATION_NONE, devices)
    assert guaranteed.edits is not None and not guaranteed.rejection  # type: ignore[attr-defined]


def test_the_pods_own_limit_annotations_change_nothing() -> None:
    devices = _devices()
    annotations = {**_burstable(devices, limit=LIMIT), names.GPU_MEMORY_LIMIT: "15Gi", names.GPU_CORE_LIMIT: "100"}
    env = dict(_decide(annotations, names.ISOLATION_HAMI_CORE, devices).edits.envs)  # type: ignore[attr-defined]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "60"


def test_a_limit_the_pod_changed_after_signing_fails_the_signature() -> None:
    devices = _devices()
    annotations = _burstable(devices, limit=LIMIT)
    annotations[names.DEVICE_ALLOCATED] = annotations[names.DEVICE_ALLOCATED].replace('"8Gi"', '"15Gi"')
    decision = _decide(annotations, names.ISOLATION_HAMI_CORE, devices)
    assert decision.edits is None and "signature" in decision.rejection  # type: ignore[attr-defined]


def test_the_admission_ledger_counts_the_request_not_the_limit() -> None:
    devices = _devices()
    gpu = devices.gpus[0]
    # Others hold 13 GiB of the 16 GiB card: the 2 GiB request fits, the 8 GiB limit would not.
    held = {gpu.uuid: GPUHeld(core_percent=70, memory_bytes=13 * GiB, pods=frozenset({"other"}))}
    decision = _decide(_burstable(devices, limit=LIMIT), names.ISOLATION_HAMI_CORE, devices, held=held)
    assert decision.edits is not None  # type: ignore[attr-defined]
    (hold,) = decision.holds  # type: ignore[attr-defined]
    assert (hold.core_percent, hold.memory_bytes) == (20, 2 * GiB)
