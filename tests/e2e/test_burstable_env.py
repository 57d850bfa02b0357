"""A burstable share's environment, as its own container prints it, through the real runtime proxy, the
agent's hook and containerd: hami-core caps memory at the limit and compute at the core limit, mps pins
memory at the limit and gives threads from the request, and a node without isolation refuses the container.

The allocation is signed with the stack's own cluster key, as fgpu-scheduler would sign it: the local
stack's scheduler keeps its state in SQLite, which holds no Node objects and so no
`fgpu.io/burstable-ratio` label, so it places no burstable pod (the scheduler's rule and its signed
limit are tested in tests/overcommit/test_scheduling.py). The annotations a pod author writes are set too
and changed after "scheduling": the node must follow the signed limit, never them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, ShareLimit
from apis.signing import allocation_annotations
from hack.localup import podrun
from hack.localup.report import ContainerState
from hack.localup.stack import NODE_NAME
from tests.e2e.conftest import BACKENDS, MIB, Node, container, describe, inventory_gpus, pod

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

REQUEST_CORE, LIMIT_CORE = 20, 60
REQUEST_RATIO, LIMIT_RATIO = 10, 30
#: What the pod's author claims (and may edit): far above the signed limit.
AUTHOR = {names.GPU_QOS: names.GPU_QOS_BURSTABLE, names.GPU_CORE_LIMIT: "100", names.GPU_MEMORY_RATIO_LIMIT: "100"}


def burstable_pod(node: Node, name: str) -> podrun.PodRun:
    gpu = inventory_gpus()[1]
    request_bytes = gpu.memory_bytes * REQUEST_RATIO // 100
    limit_bytes = gpu.memory_bytes * LIMIT_RATIO // 100
    spec = pod(name, [container("main", core=REQUEST_CORE, ratio=REQUEST_RATIO)], scheduler="")
    spec["metadata"]["annotations"] = dict(AUTHOR)
    prepared = podrun.prepare(spec)
    allocation = Allocation(gpus=(GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=REQUEST_CORE, memory_bytes=request_bytes,
        memory_ratio_percent=REQUEST_RATIO,
        containers=(ContainerShare("main", REQUEST_CORE, request_bytes, REQUEST_RATIO),),
        limit=ShareLimit(core_percent=LIMIT_CORE, memory_bytes=limit_bytes, memory_ratio_percent=LIMIT_RATIO),
    ),))
    signed = allocation_annotations(
        node.signing_key(), pod_uid=prepared["metadata"]["uid"], node_name=NODE_NAME, allocation=allocation
    )
    return node.resume(node.start(prepared, annotations=signed))


@pytest.mark.parametrize("isolation", BACKENDS)
def test_each_backend_enforces_the_signed_burstable_limit_or_refuses_it(
    nodes: Callable[..., Node], isolation: str
) -> None:
    node = nodes(isolation)
    pod_run = burstable_pod(node, f"burstable-{isolation}")
    main = pod_run.container("main")
    gpu = inventory_gpus()[1]
    limit_mib = gpu.memory_bytes * LIMIT_RATIO // 100 // MIB
    if isolation == names.ISOLATION_NONE:
        assert main.state is ContainerState.REFUSED, describe(pod_run)
        assert "burstable" in main.error and "'none'" in main.error, main.error
        return
    assert main.succeeded, describe(pod_run)
    env = dict(main.env)
    assert env[names.NVIDIA_VISIBLE_DEVICES] == gpu.uuid, describe(pod_run)
    # What is reserved is still said as the request.
    assert env[names.FGPU_MEMORY_BYTES] == str(gpu.memory_bytes * REQUEST_RATIO // 100), describe(pod_run)
    if isolation == names.ISOLATION_HAMI_CORE:
        assert env[f"{names.HAMI_MEMORY_LIMIT_PREFIX}0"] == f"{limit_mib}m", describe(pod_run)
        assert env[names.HAMI_MEMORY_LIMIT] == f"{limit_mib}m", describe(pod_run)
        assert env[names.HAMI_SM_LIMIT] == str(LIMIT_CORE), describe(pod_run)
        assert env[names.HAMI_OVERSUBSCRIBE] == "false", describe(pod_run)
    else:
        assert env[names.MPS_PINNED_MEM_LIMIT] == f"0={limit_mib}M", describe(pod_run)
        assert env[names.MPS_ACTIVE_THREAD_PERCENTAGE] == str(REQUEST_CORE), describe(pod_run)
