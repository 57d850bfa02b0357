"""The node while fgpu-agent restarts or is down, on a stack of its own (these tests stop its agent).

- A restarted agent rebuilds its admission ledger from the CRI sandboxes' verified
  allocations, so a running pod's share still counts: an allocation that would
  overcommit the GPU (a scheduler with a stale view) is refused, after the
  restart as before it.
- While the agent is down, a pod without GPUs is created as usual, with `void`;
  a GPU pod is refused with UNAVAILABLE, and kubelet's retry succeeds once the
  agent is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, decode_allocation
from apis.signing import allocation_annotations
from hack.localup import podrun
from hack.localup.report import ContainerState
from hack.localup.stack import NODE_NAME
from tests.e2e.conftest import CUDA_LIKE, Node, container, describe, pod

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

VOID = names.NVIDIA_VISIBLE_DEVICES_VOID
SLEEP = ["sleep", "3600"]


@pytest.fixture
def node(nodes: Callable[..., Node]) -> Node:
    node = nodes("hami-core", purpose="agent-lifecycle")
    node.stack.start_agent()  # whatever an earlier test left
    return node


def stale_pod(node: Node, name: str, *, like: GPUShare, core: int) -> podrun.PodRun:
    """A pod whose allocation the test writes and signs with the cluster key itself: `core` percent
    of the GPU of `like`, as a scheduler that missed the pods already there would."""
    prepared = podrun.prepare(pod(name, [container("main", core=core, ratio=core)], scheduler=""))
    memory = like.memory_bytes * core // like.core_percent
    allocation = Allocation(gpus=(GPUShare(
        minor=like.minor, uuid=like.uuid, core_percent=core, memory_bytes=memory, memory_ratio_percent=core,
        containers=(ContainerShare(name="main", core_percent=core, memory_bytes=memory, memory_ratio_percent=core),),
    ),))
    annotations = allocation_annotations(
        node.signing_key(), pod_uid=prepared["metadata"]["uid"], node_name=NODE_NAME, allocation=allocation
    )
    return node.resume(node.start(prepared, annotations=annotations))


def test_a_restarted_agent_still_counts_a_running_pods_share(node: Node) -> None:
    running = node.run(pod("holds-60", [container("main", core=60, ratio=60, command=SLEEP)]), leave_running=True)
    main = running.container("main")
    assert main.state is ContainerState.RUNNING, describe(running)
    (share,) = decode_allocation(running.annotations[names.DEVICE_ALLOCATED]).gpus
    assert main.env[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, describe(running)

    # Control: the agent that admitted holds-60 refuses 60% more of the same GPU.
    before = stale_pod(node, "stale-60-before", like=share, core=60)
    refused = before.container("main")
    assert refused.state is ContainerState.REFUSED, describe(before)
    assert running.uid in refused.error, f"refused, but not for holds-60's share: {refused.error}"
    node.remove(before)  # its sandbox carries a verified allocation too: it must not be there at the restart

    node.stack.restart_agent()
    assert node.container_running(main.container_id), "the agent's restart stopped a running container"

    after = stale_pod(node, "stale-60-after", like=share, core=60)
    refused = after.container("main")
    assert refused.state is ContainerState.REFUSED, (
        "a restarted agent admitted 60% of a GPU a running pod holds 60% of\n" + describe(after)
    )
    assert running.uid in refused.error, f"refused, but not for holds-60's share: {refused.error}"


def test_while_the_agent_is_down_cpu_pods_run_with_void_and_gpu_pods_wait_for_it(node: Node) -> None:
    node.stack.stop_agent()
    try:
        cpu = node.run(pod("cpu-agent-down", [container("main", image=CUDA_LIKE)], scheduler=""))
        assert cpu.container("main").succeeded, describe(cpu)
        assert cpu.container("main").env[names.NVIDIA_VISIBLE_DEVICES] == VOID, describe(cpu)

        gpu = node.run(pod("gpu-agent-down", [container("main", core=50, ratio=50)]))
        refused = gpu.container("main")
        assert refused.state is ContainerState.REFUSED, describe(gpu)
        assert refused.error_code == "UNAVAILABLE", describe(gpu)
    finally:
        node.stack.start_agent()

    # kubelet retries CreateContainer with backoff; the proxy's channel to the agent reconnects.
    deadline = time.monotonic() + 15
    while gpu.container("main").state is ContainerState.REFUSED and time.monotonic() < deadline:
        time.sleep(0.5)
        node.resume(gpu)
    main = gpu.container("main")
    assert main.succeeded, describe(gpu)
    (share,) = decode_allocation(gpu.annotations[names.DEVICE_ALLOCATED]).gpus
    assert main.env[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, describe(gpu)
    assert main.env[names.FGPU_CORE_PERCENT] == "50", describe(gpu)
