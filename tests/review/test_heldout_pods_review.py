"""Held-out pods against fgpu's node-safety promise, end to end.

Each pod here is one the authors' tests never tried. It goes through the real
parts (fgpu-scheduler's gRPC API -> fgpu-runtime-proxy -> the agent's hook ->
real containerd), and what is checked is the container's OWN environment, as
it printed it. Each test was written failing, for a defect since fixed.

The local stacks come from tests/e2e/conftest.py (imported below, so that this
module gets its own shared stacks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from apis import names
from apis.allocation import decode_allocation
from hack.localup import podrun
from hack.localup.placing import Unschedulable
from tests.e2e import conftest as e2e
from tests.e2e.conftest import BUSYBOX, Node, container, describe, pod

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

# The e2e fixtures, by name: `stacks` (session) and `nodes` (a Node on a shared stack of a backend).
stacks = e2e.stacks
nodes = e2e.nodes

FULL = 100


def _memory_only(name: str, memory: str) -> dict[str, Any]:
    """A container asking GPU memory only (no gpu-core): Koordinator's, HAMi's or Aliyun's memory-only share."""
    return {
        "name": name, "image": BUSYBOX, "command": ["sh", "-c", "env"],
        "resources": {"limits": {names.GPU_MEMORY: memory}},
    }


def _compute_cap(env: dict[str, str], ordinal: int) -> tuple[int, str]:
    """The compute a container may use on its CUDA ordinal, in percent, and the variable that says so.

    HAMi-core reads CUDA_DEVICE_SM_LIMIT(_<i>) 0 as no limit; MPS caps a client at
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (100 when unset).
    """
    if env.get(names.FGPU_ISOLATION) == names.ISOLATION_MPS:
        value = env.get(names.MPS_ACTIVE_THREAD_PERCENTAGE, str(FULL))
        return int(value) or FULL, f"{names.MPS_ACTIVE_THREAD_PERCENTAGE}={value}"
    key = f"{names.HAMI_SM_LIMIT}_{ordinal}"
    value = env.get(key, env.get(names.HAMI_SM_LIMIT, "0"))
    return int(value) or FULL, f"{key}={value}"


def _reserved_core(pod_run: podrun.PodRun) -> dict[str, int]:
    """GPU UUID -> the compute percent a pod's signed allocation reserves on it."""
    allocation = decode_allocation(pod_run.annotations[names.DEVICE_ALLOCATED])
    return {share.uuid: share.core_percent for share in allocation.gpus}


@pytest.mark.parametrize("isolation", [names.ISOLATION_HAMI_CORE, names.ISOLATION_MPS])
def test_a_memory_only_pod_cannot_take_the_compute_other_pods_reserved_on_its_card(
    nodes: Callable[..., Node], isolation: str
) -> None:
    node = nodes(isolation)
    # Every card's compute reserved whole (with half its memory), so no card has compute to spare.
    reserved: dict[str, int] = {}
    holders: list[podrun.PodRun] = []
    for i in range(8):
        holder = node.run(pod(f"all-compute-{i}", [container("trainer", core=FULL, ratio=50)]))
        assert holder.container("trainer").succeeded, describe(holder)
        holders.append(holder)
        for uuid, core in _reserved_core(holder).items():
            reserved[uuid] = reserved.get(uuid, 0) + core
    assert sorted(reserved.values()) == [FULL] * 8, reserved

    spec = podrun.prepare(pod("memory-only", [_memory_only("inference", "10Gi")]))
    placed = node.scheduler.place(spec)
    if isinstance(placed, Unschedulable):
        return  # refused: no card has compute left for a share without a compute limit
    node._bound.append(spec)  # released at the scheduler when the test ends, as Node.schedule's are
    pod_run = podrun.run(node.kubelet, node.start(spec, annotations=placed.annotations))
    inference = pod_run.container("inference")
    if not inference.succeeded:
        return  # refused on the node: as good
    env = dict(inference.env)
    seen = [u for u in env[names.NVIDIA_VISIBLE_DEVICES].split(",") if u]
    report = describe(pod_run) + "\n" + "\n".join(describe(h) for h in holders if set(_reserved_core(h)) & set(seen))
    for ordinal, uuid in enumerate(seen):
        others = reserved.get(uuid, 0)
        cap, said = _compute_cap(env, ordinal)
        assert others + cap <= FULL, (
            f"{uuid}: other pods reserved {others}% of its compute, and this memory-only container may use "
            f"{cap}% ({said})\n{report}"
        )
