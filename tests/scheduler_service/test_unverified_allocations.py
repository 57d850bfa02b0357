"""A bound pod's allocation counts as written only when its signature verifies; otherwise conservatively."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from apis import names
from apis.allocation import decode_allocation, encode_allocation
from scheduler_plugin.boundpods import Basis
from scheduler_plugin.events import ALLOCATION_NOT_VERIFIED, EventRecorder
from tests.scheduler_service.builders import GiB, gpu_node, pod, share_pod, whole_pod
from tests.scheduler_service.podstore import Cluster
from tests.scheduler_service.views import over_capacity


def _flood(uuid: str, *, entries: int, core: int = 100, memory: int = 10**30) -> str:
    entry = {"minor": 0, "id": uuid, "resources": {names.GPU_CORE: str(core), names.GPU_MEMORY: str(memory)}}
    return json.dumps({"gpu": [entry] * entries})


def _lowered(annotation: str, *, core: int, memory: int) -> str:
    """The same allocation with every share edited down (what a pod author would write)."""
    allocation = decode_allocation(annotation)
    shares = tuple(dataclasses.replace(s, core_percent=core, memory_bytes=memory, memory_ratio_percent=1, containers=()) for s in allocation.gpus)
    return encode_allocation(dataclasses.replace(allocation, gpus=shares))


def _uid(p: dict[str, Any]) -> str:
    return str(p["metadata"]["uid"])


def test_a_forged_pod_with_5000_entries_counts_as_its_request_and_overflows_nothing() -> None:
    c = Cluster(gpu_node("n1", gpus=1, memory_gib=80))
    forged = share_pod("forged", core=10, memory="1Gi", node_name="n1", annotations={names.DEVICE_ALLOCATED: _flood("GPU-n1-00", entries=5000)})

    c.deliver(forged)
    assert c.gpu("n1", "GPU-n1-00") == (10, GiB)
    c.restart()

    assert c.gpu("n1", "GPU-n1-00") == (10, GiB)
    assert c.service.filter(share_pod("next", core=90, memory="79Gi"), ["n1"]).verdicts[0].feasible


def test_editing_a_running_pods_allocation_down_to_1_percent_frees_nothing() -> None:
    c = Cluster(gpu_node("n1", gpus=1, memory_gib=80))
    bound = c.bind(share_pod("p", core=90, memory="60Gi"), "n1")

    c.edit(_uid(bound), DEVICE_ALLOCATED=_lowered(bound["metadata"]["annotations"][names.DEVICE_ALLOCATED], core=1, memory=GiB))

    assert c.gpu("n1", "GPU-n1-00") == (90, 60 * GiB)
    assert not c.service.filter(share_pod("next", core=90, memory="10Gi"), ["n1"]).verdicts[0].feasible
    [found] = c.service.unverified()
    assert (found.name, found.basis) == ("p", Basis.LAST_VERIFIED)


def test_removing_the_allocation_annotations_frees_nothing_across_a_resync() -> None:
    c = Cluster(gpu_node("n1", gpus=1, memory_gib=80))
    bound = c.bind(whole_pod("p"), "n1")

    c.edit(_uid(bound), DEVICE_ALLOCATED=None, ALLOCATION_SIGNATURE=None, ALLOCATION_NODE=None)
    c.service.resync(c.store)

    assert c.gpu("n1", "GPU-n1-00") == (100, 80 * GiB)
    assert not c.service.filter(whole_pod("next"), ["n1"]).verdicts[0].feasible


def test_after_a_restart_an_edited_pod_counts_as_its_request_on_the_gpu_it_names() -> None:
    c = Cluster(gpu_node("n1", gpus=2, memory_gib=80))
    bound = c.bind(share_pod("p", core=90, memory="60Gi"), "n1")
    [gpu] = decode_allocation(bound["metadata"]["annotations"][names.DEVICE_ALLOCATED]).uuids
    c.edit(_uid(bound), DEVICE_ALLOCATED=_lowered(bound["metadata"]["annotations"][names.DEVICE_ALLOCATED], core=1, memory=GiB))

    c.restart()

    assert c.gpu("n1", gpu) == (90, 60 * GiB)
    [found] = c.service.unverified()
    assert found.basis is Basis.REQUEST


def test_another_pods_allocation_copied_onto_a_pod_adds_nothing_to_a_full_gpu() -> None:
    c = Cluster(gpu_node("n1", gpus=1, memory_gib=80))
    bound = c.bind(whole_pod("p"), "n1")
    copied = {k: v for k, v in bound["metadata"]["annotations"].items()}

    c.deliver(share_pod("copycat", core=50, memory="10Gi", node_name="n1", annotations=copied))

    assert c.gpu("n1", "GPU-n1-00") == (100, 80 * GiB)
    assert over_capacity(c.service) == []


def test_an_unverified_pods_share_shrinks_when_a_verified_pod_lands_on_its_gpu() -> None:
    c = Cluster(gpu_node("n1", gpus=1, memory_gib=80))
    forged = share_pod("forged", core=60, memory="40Gi", node_name="n1", annotations={names.DEVICE_ALLOCATED: _flood("GPU-n1-00", entries=1, core=60, memory=40 * GiB)})
    c.deliver(forged)
    assert c.gpu("n1", "GPU-n1-00") == (60, 40 * GiB)
    # Another scheduler instance, which never saw the forged pod, places a pod on the same GPU.
    elsewhere = Cluster(gpu_node("n1", gpus=1, memory_gib=80))
    verified = elsewhere.bind(share_pod("verified", core=70, memory="50Gi"), "n1")

    c.deliver(verified)

    assert c.gpu("n1", "GPU-n1-00") == (100, 80 * GiB)
    [found] = c.service.unverified()
    assert (found.name, found.counted.gpus[0].core_percent, found.counted.gpus[0].memory_bytes) == ("forged", 30, 30 * GiB)


def test_a_pod_that_requests_no_gpu_counts_no_gpu_whatever_its_annotation_says() -> None:
    c = Cluster(gpu_node("n1", gpus=1))

    c.deliver(pod("cpu", requests={"cpu": "1"}, node_name="n1", annotations={names.DEVICE_ALLOCATED: _flood("GPU-n1-00", entries=3)}))

    assert c.gpu("n1", "GPU-n1-00") == (0, 0)
    [found] = c.service.unverified()
    assert found.basis is Basis.NOTHING


def test_signed_allocations_count_as_written_and_are_not_reported() -> None:
    c = Cluster(gpu_node("n1", gpus=1, memory_gib=80))
    c.bind(share_pod("p", core=30, memory="8Gi"), "n1")

    c.restart()

    assert c.gpu("n1", "GPU-n1-00") == (30, 8 * GiB)
    assert c.service.unverified() == ()


def test_each_unverified_pod_gets_one_event_is_counted_in_metrics_and_leaves_the_gauge_when_deleted() -> None:
    posted: list[dict[str, Any]] = []
    c = Cluster(gpu_node("n1", gpus=1), recorder=lambda: EventRecorder(sink=lambda _ns, body: posted.append(body), clock=lambda: 0.0, instance="t"))
    bound = c.bind(share_pod("p", core=50, memory="8Gi"), "n1")
    uid = _uid(bound)

    edited = c.edit(uid, ALLOCATION_SIGNATURE="v1:" + "0" * 64)
    c.deliver({**edited, "status": {"phase": "Running"}})  # a status update: not news

    registry = c.service.metrics.registry
    events = [e for e in posted if e["reason"] == ALLOCATION_NOT_VERIFIED]
    assert len(events) == 1
    assert events[0]["type"] == "Warning" and events[0]["involvedObject"]["uid"] == uid
    assert "default/p" in events[0]["message"] and "last verified" in events[0]["message"]
    assert registry.get_sample_value("fgpu_scheduler_unverified_allocations") == 1
    assert registry.get_sample_value("fgpu_scheduler_unverified_allocations_found_total", {"counted": "last-verified"}) == 1
    c.delete(uid)
    assert registry.get_sample_value("fgpu_scheduler_unverified_allocations") == 0
