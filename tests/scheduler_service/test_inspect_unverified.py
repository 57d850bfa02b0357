"""`fgpuctl inspect` with verifying keys names the pods whose allocation does not verify, and counts them as the scheduler does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apis import names
from fgpuctl import main as fgpuctl
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import GiB, gpu_node, share_pod
from tests.scheduler_service.conftest import KEY
from tests.signing_keys import write_verifying_keys


def test_inspect_marks_and_lists_an_edited_allocation_and_counts_its_request(
    kube_api: KubeAPIServer, key_file: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = write_verifying_keys(str(tmp_path / "verifying-keys"), KEY)
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1, memory_gib=80))
    app = cluster.start(cluster.config(kube_api, key_file))
    try:
        assert app.service is not None
        app.service.bind(cluster.add_pod(kube_api, share_pod("honest", core=30, memory="8Gi")), "n1")
        app.service.bind(cluster.add_pod(kube_api, share_pod("edited", core=60, memory="40Gi")), "n1")
    finally:
        app.stop(1.0)
    edited = cluster.get_pod(kube_api, "edited")
    text = edited["metadata"]["annotations"][names.DEVICE_ALLOCATED]
    edited["metadata"]["annotations"][names.DEVICE_ALLOCATED] = text.replace('"koordinator.sh/gpu-core":"60"', '"koordinator.sh/gpu-core":"1"')
    kube_api.put_object("/api/v1/namespaces/default/pods", edited)

    assert fgpuctl.main(["inspect", "-o", "json", "--kubeconfig", kube_api.kubeconfig_path, "--verifying-keys", keys]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert fgpuctl.main(["inspect", "--kubeconfig", kube_api.kubeconfig_path, "--verifying-keys", keys]) == 0
    table = capsys.readouterr().out
    assert fgpuctl.main(["inspect", "-o", "json", "--kubeconfig", kube_api.kubeconfig_path]) == 0
    unchecked = json.loads(capsys.readouterr().out)

    [found] = checked["unverifiedAllocations"]
    assert (found["name"], found["node"], found["countedAs"]) == ("edited", "n1", "request")
    assert found["counted"] == {"corePercent": 60, "memoryBytes": 40 * GiB}
    assert "does not match" in found["problem"]
    [gpu] = checked["nodes"][0]["gpus"]
    assert gpu["core"]["allocated"] == 90
    assert {p["name"]: p["unverified"] for p in gpu["pods"]} == {"honest": False, "edited": True}
    assert "default/edited(60%,40.0Gi,unverified)" in table
    assert "Allocations that do not verify" in table and "default/edited on n1: counted as request (60%,40.0Gi)" in table
    assert unchecked["unverifiedAllocations"] is None
    assert unchecked["nodes"][0]["gpus"][0]["core"]["allocated"] == 31  # as written: nothing was checked
