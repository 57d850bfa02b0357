"""`fgpuctl inspect`, from the API and from a running scheduler, agree and read like kubectl inspect gpushare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fgpuctl import main as fgpuctl
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, share_pod, whole_pod


def test_inspect_from_the_api_and_from_the_scheduler_show_the_same_allocations(
    kube_api: KubeAPIServer, key_file: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=2, unhealthy=(1,)))
    cluster.add_node(kube_api, gpu_node("n2", gpus=1))
    socket = tmp_path / "sched.sock"
    app = cluster.start(cluster.config(kube_api, key_file, grpc_listen=f"unix://{socket}"))
    try:
        assert app.service is not None
        app.service.bind(cluster.add_pod(kube_api, share_pod("small", core=30, memory="8Gi")), "n1")
        app.service.bind(cluster.add_pod(kube_api, whole_pod("big")), "n2")
        cluster.eventually(
            lambda: app.service is not None and all(not p.assumed for v in app.service.node_views() for g in v.gpus for p in g.pods),
            what="binds seen",
        )

        assert fgpuctl.main(["inspect", "-o", "json", "--kubeconfig", kube_api.kubeconfig_path]) == 0
        from_api = json.loads(capsys.readouterr().out)
        assert fgpuctl.main(["inspect", "-o", "json", "--scheduler", f"unix://{socket}"]) == 0
        from_scheduler = json.loads(capsys.readouterr().out)
        assert fgpuctl.main(["inspect", "--scheduler", f"unix://{socket}"]) == 0
        text = capsys.readouterr().out
    finally:
        app.stop(1.0)

    assert from_api == from_scheduler
    n1 = from_api["nodes"][0]
    assert [(g["core"]["allocated"], g["healthy"]) for g in n1["gpus"]] == [(30, True), (0, False)]
    assert n1["gpus"][0]["pods"][0]["name"] == "small"
    assert from_api["total"]["core"] == {"allocated": 130, "total": 200}
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "GPU", "MODEL", "HEALTH", "CORE(alloc/total)", "MEMORY(alloc/total)", "PODS"]
    assert "default/small(30%,8.0Gi)" in lines[1] and "unhealthy(Xid79)" in lines[2]
    assert lines[-1].startswith("Allocated/Total GPU core in cluster: 130/200 (65%)")


def test_inspect_of_an_unreachable_scheduler_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = fgpuctl.main(["inspect", "--scheduler", f"unix://{tmp_path}/none.sock"])

    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("fgpuctl inspect: --scheduler=unix://") and "UNAVAILABLE" in err
