"""Explaining a refusal on a node whose GPUs bound pods have over-allocated."""

from __future__ import annotations

from apis.allocation import Allocation, GPUShare
from scheduler_plugin import pods
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_service.builders import GiB, gpu_node, share_pod, whole_pod


def test_a_node_whose_every_gpu_is_over_allocated_is_explained_not_crashed_on() -> None:
    core = Scheduler()
    core.upsert_node_devices(gpu_node("n1", gpus=2, memory_gib=40))

    def whole(i: int) -> Allocation:
        return Allocation(gpus=(GPUShare(i, f"GPU-n1-{i:02d}", 100, 40 * GiB, 100),))

    # Bound pods are counted as found, so a node can end up past 100% (two binds raced, say).
    for name, gpu in (("a", 0), ("b", 0), ("c", 1)):
        core.add_pod(pods.request_of(whole_pod(name), rules=None), NodeName("n1"), whole(gpu))
    extra = Allocation(gpus=(GPUShare(1, "GPU-n1-01", 10, GiB, 0),))
    core.add_pod(pods.request_of(share_pod("d", core=10, memory="1Gi"), rules=None), NodeName("n1"), extra)

    (verdict,) = core.filter(pods.request_of(share_pod("next", core=10, memory="1Gi"), rules=None), [NodeName("n1")])

    assert not verdict.feasible
    assert "most free: GPU 1 with -10% core" in verdict.reason
