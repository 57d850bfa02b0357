"""Dynamic MIG end to end: fgpu-scheduler -> fgpu-runtime-proxy -> fgpu-agent's hook -> real containerd,
on the example node with two A100s in MIG mode and no instances of fgpu's yet
(examples/inventories/a100-2x-mig-dynamic.yaml; GPU 1 holds one operator-made 1g.10gb).

Pods that ask for GPU memory get a MIG instance the agent creates for them at the
scheduler's profile and placement: each container's OWN environment (as `env` run in it
printed it) names the new MIG device, and the agent's next report shows the instance
as fgpu's. Once the pods are removed the instances are gone, and the operator's stays.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from apis import names
from apis.allocation import decode_allocation
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from hack.localup.report import ContainerState
from hack.localup.stack import NODE_NAME, Paths, Settings, Stack, StackError, teardown
from tests.e2e.conftest import Node, _unavailable, describe, pod
from tests.localup.manifests import REPO

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

INVENTORY = REPO / "examples" / "inventories" / "a100-2x-mig-dynamic.yaml"
OPERATORS = "MIG-0c7e4d1a-2b3c-4d5e-8f60-718293a4b5c6"
SLEEP = ["sleep", "3600"]


@pytest.fixture(scope="module")
def mig_node() -> Iterator[Node]:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    root = tempfile.mkdtemp(prefix="fgpu-e2e-mig-", dir="/tmp")  # short: unix socket paths
    stack = Stack(Paths(root), Settings(repo=str(REPO), inventory=str(INVENTORY), isolation=names.ISOLATION_HAMI_CORE))
    try:
        try:
            stack.start()
        except StackError as exc:
            pytest.fail(f"local stack on the MIG node did not come up: {exc}")
        node = Node(stack)
        try:
            yield node
        finally:
            node.close()
    finally:
        stack.stop()
        teardown(root)


def mig_instances(node: Node) -> dict[str, tuple[str, int, bool]]:
    """MIG UUID -> (profile, placement start, fgpu_created), as the agent last reported the node to the scheduler."""
    with grpc.insecure_channel(node.stack.scheduler_address) as channel:
        state = scheduler_pb2_grpc.SchedulerStub(channel).GetNodeState(  # type: ignore[no-untyped-call]
            scheduler_pb2.GetNodeStateRequest(node_names=[NODE_NAME]), timeout=5
        )
    return {
        m.uuid: (m.profile, m.placement_start, m.fgpu_created)
        for n in state.nodes for g in n.gpus for m in g.device.mig_instances
    }


def wait_for(node: Node, want: dict[str, tuple[str, int, bool]], *, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (seen := mig_instances(node)) != want:
        if time.monotonic() > deadline:
            pytest.fail(f"the scheduler sees MIG instances {seen}, expected {want}\n{node.logs()}")
        time.sleep(0.1)


def mig_container(name: str, memory: str) -> dict[str, Any]:
    return {
        "name": name, "image": "fgpu.local/busybox:1", "command": SLEEP,
        "resources": {"limits": {names.GPU_MEMORY: memory}},
    }


def test_pods_get_mig_instances_created_for_them_and_the_instances_go_with_the_pods(mig_node: Node) -> None:
    operator_only = {OPERATORS: ("1g.10gb", mig_instances(mig_node)[OPERATORS][1], False)}
    assert mig_instances(mig_node) == operator_only  # nothing of fgpu's before the pods
    sidecar = {"name": "sidecar", "image": "fgpu.local/busybox:1", "command": SLEEP}
    runs = [
        # More than the operator's free 1g.10gb holds (the scheduler would hand that out as it is).
        mig_node.run(pod("mig-small", [mig_container("main", "15Gi")]), leave_running=True),
        mig_node.run(pod("mig-large", [mig_container("main", "30Gi"), sidecar]), leave_running=True),
    ]

    expected = dict(operator_only)
    for run in runs:
        main = run.container("main")
        assert main.state is ContainerState.RUNNING, describe(run)
        (share,) = decode_allocation(run.annotations[names.DEVICE_ALLOCATED]).gpus
        assert share.mig_profile and share.mig_placement >= 0, f"not a MIG create: {share}\n{describe(run)}"
        visible = main.env[names.NVIDIA_VISIBLE_DEVICES]
        assert visible.startswith("MIG-") and visible != OPERATORS, describe(run)
        expected[visible] = (share.mig_profile, share.mig_placement, True)
    assert len(expected) == 3, f"two pods, one instance each, besides the operator's: {expected}"
    assert runs[1].container("sidecar").env[names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID
    wait_for(mig_node, expected)

    for run in runs:
        mig_node.remove(run)

    wait_for(mig_node, operator_only)
