"""The cluster gauges the dashboard and the pending-while-fragmented alert read: GPU pods waiting for fgpu
(and how long the oldest has waited), and FGD's fragmentation per GPU model, read back from the
service's own Prometheus exposition."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apis import names
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import gpu_node, pod, share_pod
from tests.scheduler_service.conftest import KEY


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SchedulingService]:
    backend = EmbeddedBackend(path=str(tmp_path / "state.db"))
    svc = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=KEY)
    backend.start(svc)
    yield svc
    backend.stop()


def samples(svc: SchedulingService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(svc.metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _created(pod_obj: dict[str, object], minutes_ago: float) -> dict[str, object]:
    stamp = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=minutes_ago)
    pod_obj["metadata"]["creationTimestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")  # type: ignore[index]
    return pod_obj


def test_pending_gpu_pods_addressed_to_fgpu_are_counted_with_the_oldest_age_until_bound(service: SchedulingService) -> None:
    old = _created(share_pod("old", scheduler_name=names.SCHEDULER_NAME), minutes_ago=20)
    new = _created(share_pod("new", scheduler_name=names.SCHEDULER_NAME), minutes_ago=1)
    cpu = _created(pod("cpu", requests={"cpu": "1"}, scheduler_name=names.SCHEDULER_NAME), minutes_ago=60)
    other = _created(share_pod("other", scheduler_name="default-scheduler"), minutes_ago=60)
    for p in (old, new, cpu, other):
        service.on_pod(p)

    before = samples(service)
    old["spec"]["nodeName"] = "n1"  # type: ignore[index]
    service.on_pod(old)
    bound = samples(service)
    service.on_pod_removed(new)
    gone = samples(service)

    assert before[("fgpu_scheduler_pending_gpu_pods", ())] == 2
    assert 19 * 60 <= before[("fgpu_scheduler_oldest_pending_gpu_pod_seconds", ())] <= 21 * 60
    assert bound[("fgpu_scheduler_pending_gpu_pods", ())] == 1
    assert 0 < bound[("fgpu_scheduler_oldest_pending_gpu_pod_seconds", ())] <= 2 * 60
    assert gone[("fgpu_scheduler_pending_gpu_pods", ())] == 0
    assert gone[("fgpu_scheduler_oldest_pending_gpu_pod_seconds", ())] == 0


def test_fragmentation_per_model_is_the_idle_share_no_placed_shape_can_use(service: SchedulingService) -> None:
    service.report_devices(gpu_node("h100", gpus=2))
    service.report_devices(gpu_node("a100", gpus=2, model="NVIDIA A100-SXM4-80GB", label="A100-80GB"))
    # Two 70% shares fill h100's GPUs to 30% free each: below the 700 milli the placed shape needs.
    for i in range(2):
        service.bind(share_pod(f"p{i}", core=70, scheduler_name=names.SCHEDULER_NAME), "h100")
    service.tick(refresh_gauges=True)
    got = {labels: v for (name, labels), v in samples(service).items() if name == "fgpu_scheduler_gpu_fragmentation_milli"}

    models = {dict(labels)["model"]: v for labels, v in got.items()}
    assert len(models) == 2
    h100 = next(v for m, v in models.items() if "H100" in m)
    a100 = next(v for m, v in models.items() if "A100" in m)
    assert h100 == pytest.approx(600.0)  # 2 x 300 milli stranded
    assert a100 == 0.0  # both GPUs free: every placed shape fits there


def test_an_empty_cluster_is_measured_against_whole_gpus_and_is_not_fragmented(service: SchedulingService) -> None:
    service.report_devices(gpu_node("h100", gpus=4))
    service.tick(refresh_gauges=True)

    values = [v for (name, _), v in samples(service).items() if name == "fgpu_scheduler_gpu_fragmentation_milli"]

    assert values == [0.0]
