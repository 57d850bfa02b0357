"""`fgpuctl inspect` from the API names the nodes whose agent reports an isolation backend that cannot work."""

from __future__ import annotations

import json

import pytest

from agent.backendcheck import CONDITION_TYPE
from fgpuctl import inspect as inspect_command
from fgpuctl import main as fgpuctl
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node

MESSAGE = "isolation hami-core: HAMi-core's library /usr/local/vgpu/libvgpu.so cannot be read (No such file or directory)"


def _condition(api: KubeAPIServer, node: str, *, status: str, reason: str, message: str) -> None:
    stored = api.get_object(f"/api/v1/nodes/{node}")
    assert stored is not None
    stored["status"]["conditions"] = [{"type": CONDITION_TYPE, "status": status, "reason": reason, "message": message}]
    api.put_object("/api/v1/nodes", stored)


def test_inspect_lists_the_nodes_that_refuse_gpu_shares_and_why(kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    cluster.add_node(kube_api, gpu_node("n2", gpus=1))
    cluster.add_node(kube_api, gpu_node("n3", gpus=1))
    _condition(kube_api, "n1", status="False", reason="LibraryMissing", message=MESSAGE)
    _condition(kube_api, "n2", status="True", reason="Ready", message="hami-core: ready")

    assert fgpuctl.main(["inspect", "--kubeconfig", kube_api.kubeconfig_path]) == 0
    text = capsys.readouterr().out
    assert fgpuctl.main(["inspect", "-o", "json", "--kubeconfig", kube_api.kubeconfig_path]) == 0
    report = json.loads(capsys.readouterr().out)

    lines = text.splitlines()
    start = lines.index("Nodes that refuse GPU shares (isolation backend not ready; whole GPUs and MIG still work):")
    assert lines[start + 1:] == [f"  n1: LibraryMissing: {MESSAGE}"]
    by_node = {n["name"]: n["isolation"] for n in report["nodes"]}
    assert by_node["n1"] == {"ready": False, "reason": "LibraryMissing", "message": MESSAGE}
    assert by_node["n2"] == {"ready": True, "reason": "Ready", "message": "hami-core: ready"}
    assert by_node["n3"] is None  # no agent report: unknown, not "ready"


def test_inspect_reads_the_condition_the_agent_writes() -> None:
    assert inspect_command.ISOLATION_CONDITION == CONDITION_TYPE
