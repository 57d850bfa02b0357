"""The hook registration we ship (hack/systemd/10-fgpu-agent-hook.yaml), with the agent down.

The file is used as shipped; only its `endpoint` is moved to a socket in a temp
dir, where nothing listens (the agent is down: crashed, over its memory limit,
mid rolling update). Every other pod on the node must still start, and a pod
with a GPU allocation must still be refused.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from apis import names
from runtimeproxy import hookconfig
from runtimeproxy.config import ProxyConfig
from tests.runtimeproxy.kubelet import ContainerSpec, PodSpec, env_of
from tests.runtimeproxy.rig import ProxyRig

SHIPPED = Path(__file__).resolve().parents[2] / "hack" / "systemd" / "10-fgpu-agent-hook.yaml"
#: Where the install line in the file puts it.
INSTALLED_NAME = "10-fgpu-agent.yaml"

ALLOCATION = '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"}}]}'


def shipped_with_endpoint(endpoint: str) -> dict[str, Any]:
    """The shipped registration with only its endpoint replaced."""
    doc: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())
    (entry,) = doc["hooks"]
    entry["endpoint"] = endpoint
    return doc


def test_the_shipped_registration_parses_with_failure_policy_ignore() -> None:
    (server,) = hookconfig.parse_file(str(SHIPPED))
    assert server.name == "fgpu-agent"
    assert server.failure_policy is hookconfig.FailurePolicy.IGNORE
    assert hookconfig.Stage.PRE_CREATE_CONTAINER in server.stages
    assert server.timeout_s == 2.0
    assert f"/etc/fgpu/hooks.d/{INSTALLED_NAME}" in SHIPPED.read_text()


def test_the_shipped_endpoint_is_outside_the_proxys_socket_directory() -> None:
    (server,) = hookconfig.parse_file(str(SHIPPED))
    proxy = ProxyConfig()
    hook_dir = Path(server.endpoint.removeprefix("unix://")).parent
    assert hook_dir == Path("/var/run/fgpu-agent")
    for address in (proxy.listen, proxy.admin_listen):
        assert Path(address.removeprefix("unix://")).parent != hook_dir


@pytest.fixture
def agent_down_rig(rig: ProxyRig) -> ProxyRig:
    """The proxy in front of real containerd, with the shipped registration pointing at a dead socket."""
    dead = os.path.join(tempfile.mkdtemp(prefix="fgpu-agent-down-", dir="/tmp"), "hooks.sock")
    doc = shipped_with_endpoint(f"unix://{dead}")
    os.makedirs(rig.hook_dir, exist_ok=True)
    path = os.path.join(rig.hook_dir, INSTALLED_NAME)
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    # Everything but the endpoint is as shipped.
    (shipped,) = hookconfig.parse_file(str(SHIPPED))
    (written,) = hookconfig.parse_file(path)
    assert written.endpoint == f"unix://{dead}" != shipped.endpoint
    assert (written.name, written.stages, written.failure_policy, written.timeout_s) == (
        shipped.name, shipped.stages, shipped.failure_policy, shipped.timeout_s
    )
    assert not os.path.exists(dead)
    return rig.start()


@pytest.mark.containerd
def test_with_the_agent_down_a_pod_without_an_allocation_starts_with_void(agent_down_rig: ProxyRig) -> None:
    spec = ContainerSpec(name="main", image="fgpu.local/cuda-like:1", command=["env"])
    with agent_down_rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="cni-like-pod", namespace="kube-system"))
        try:
            assert k.sandbox_status(pod.sandbox_id).state == 0  # SANDBOX_READY
            text, status = k.run_to_completion(pod, spec)
        finally:
            k.teardown(pod)
    assert status.exit_code == 0, text
    assert env_of(text)[names.NVIDIA_VISIBLE_DEVICES] == names.NVIDIA_VISIBLE_DEVICES_VOID
    # The hook was registered and called, and its failure was skipped (not an absent registration).
    assert agent_down_rig.metric(
        "fgpu_runtime_proxy_hook_errors_total",
        {"server": "fgpu-agent", "stage": "PreCreateContainer", "reason": "unavailable"},
    ) >= 1


@pytest.mark.containerd
def test_with_the_agent_down_a_pod_with_an_allocation_is_refused_unavailable(agent_down_rig: ProxyRig) -> None:
    spec = ContainerSpec(name="main", image="fgpu.local/cuda-like:1", command=["env"])
    with agent_down_rig.kubelet() as k:
        pod = k.run_pod(PodSpec(name="gpu-pod", annotations={names.DEVICE_ALLOCATED: ALLOCATION}))
        try:
            with pytest.raises(grpc.RpcError) as err:
                k.create_container(pod, spec)
            assert not k.list_containers(pod_sandbox_id=pod.sandbox_id)
        finally:
            k.teardown(pod)
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    details = err.value.details() or ""
    assert "the pod carries a GPU allocation and hook server 'fgpu-agent' failed" in details, details
    assert agent_down_rig.metric(
        "fgpu_runtime_proxy_refused_total", {"method": "CreateContainer", "reason": "hooks"}
    ) >= 1
