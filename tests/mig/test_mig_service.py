"""Through the scheduler service, on the dynamic-MIG example inventory as the agent reports it:
a pod asking for MIG gets a profile and placement in its signed allocation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apis import names
from apis.devices import NodeDevices
from apis.mig import A100_80GB
from apis.signing import verify_pod_annotations
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import share_pod
from tests.scheduler_service.conftest import KEY
from tests.scheduler_service.test_examples_placement import ROOT, device_of

INVENTORY = ROOT / "examples" / "inventories" / "a100-2x-mig-dynamic.yaml"
NODE = INVENTORY.stem
GPU0, GPU1 = "GPU-5e1d0a7c-3b1f-4c6e-9a2d-7f0e1b2c3d40", "GPU-5e1d0a7c-3b1f-4c6e-9a2d-7f0e1b2c3d41"
OPERATOR_1G = "MIG-0c7e4d1a-2b3c-4d5e-8f60-718293a4b5c6"


@pytest.fixture(scope="module")
def devices() -> NodeDevices:
    return device_of(INVENTORY)


@pytest.fixture
def service(tmp_path: Path, devices: NodeDevices) -> Iterator[SchedulingService]:
    backend = EmbeddedBackend(path=str(tmp_path / "state.db"))
    svc = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=KEY)
    backend.start(svc)
    svc.report_devices(devices)
    yield svc
    backend.stop()


def mig_pod(name: str, memory: str, mode: str = "mig") -> dict[str, object]:
    return share_pod(name, core=10, memory=memory, annotations={names.GPU_MODE: mode})


def test_the_inventory_reports_profiles_and_the_operators_instance_with_its_placement(devices: NodeDevices) -> None:
    assert [g.mig_enabled for g in devices.gpus] == [True, True]
    assert all({p.name for p in g.mig_profiles} == {p.name for p in A100_80GB} for g in devices.gpus)
    (instance,) = devices.gpus[1].mig_instances
    assert (instance.uuid, instance.profile, instance.placement_start, instance.fgpu_created) == (OPERATOR_1G, "1g.10gb", 0, False)


def test_mig_pods_get_signed_profiles_and_placements_and_the_operators_instance(service: SchedulingService) -> None:
    placed = []
    for name, memory in (("a", "30Gi"), ("b", "30Gi"), ("c", "5Gi"), ("d", "15Gi")):
        pod = mig_pod(name, memory)
        signed = service.schedule(pod)
        assert signed is not None, name
        allocation = verify_pod_annotations(
            KEY.verifying_keys(), pod_uid=pod["metadata"]["uid"], node_name=NODE, annotations=signed.annotations  # type: ignore[index]
        )
        (share,) = allocation.gpus
        placed.append((name, share.uuid, share.mig_profile, share.mig_placement, share.mig_uuid))

    assert placed == [
        # GPU 1 is carved already (the operator's 1g.10gb at slice 0): a 3g at 4 there keeps GPU 0 whole.
        ("a", GPU1, "3g.40gb", 4, ""),
        # GPU 1 has no 3g placement left (0..3 overlaps the 1g): GPU 0, at 4, keeps its 4g placement {0}:4.
        ("b", GPU0, "3g.40gb", 4, ""),
        # A free instance that holds the request comes before creating one.
        ("c", GPU1, "", -1, OPERATOR_1G),
        # 1g.20gb (one compute slice, 2 memory slices) in what is left, where it blocks least.
        ("d", GPU1, "1g.20gb", 2, ""),
    ]


def test_a_shared_pod_is_refused_on_a_mig_only_node_with_the_reason(service: SchedulingService) -> None:
    pod = mig_pod("s", "5Gi", mode="shared")

    assert service.schedule(pod) is None
    (verdict,) = service.filter(pod, [NODE]).verdicts  # type: ignore[arg-type]
    assert "fgpu.io/gpu-mode=shared refuses MIG instances" in verdict.reason
