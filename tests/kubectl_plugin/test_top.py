"""`fgpuctl top`: per-pod GPU use scraped from the agents found through the API, beside each allocation."""

from __future__ import annotations

import json

import pytest

from fgpuctl import top
from fgpuctl.main import main as fgpuctl
from tests.kubeapi.server import KubeAPIServer
from tests.kubectl_plugin import cluster
from tests.kubectl_plugin.agents import GiB, agents
from tests.observability.exported import exported_by_daemon


@pytest.fixture
def seeded(kube_api: KubeAPIServer, agent_ports: dict[str, int]) -> KubeAPIServer:
    cluster.seed(kube_api, agent_ports)
    return kube_api


def _top(api: KubeAPIServer, capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    assert fgpuctl(["top", "--kubeconfig", api.kubeconfig_path, "-o", "json", *args]) == 0, capsys.readouterr().err
    rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)["pods"]
    return rows


def test_top_shows_each_pods_gpu_memory_in_use_beside_its_allocation(seeded: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _top(seeded, capsys)
    got = [(r["namespace"], r["pod"], r["node"], r["gpu"], r["memory_used_bytes"], r["processes"], r["memory_allocated_bytes"],
            r["core_allocated_percent"]) for r in rows]
    assert got == [
        ("", "(uid uid-gone)", "", "GPU-n2-00", 1 * GiB, 1, -1, -1),
        ("ml", "serve-0", "n1", "GPU-n1-00", 0, 0, 20 * GiB, 25),
        ("ml", "train-0", "n1", "GPU-n1-00", 32 * GiB, 2, 40 * GiB, 50),
        ("web", "embed-0", "n2", "GPU-n2-01", 61 * GiB, 1, 80 * GiB, 100),
    ]
    assert {r["gpu_sm_percent"] for r in rows} == {40.0}


def test_a_namespace_and_pod_names_narrow_the_rows(seeded: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert [r["pod"] for r in _top(seeded, capsys, "-n", "ml")] == ["serve-0", "train-0"]
    assert [r["pod"] for r in _top(seeded, capsys, "embed-0")] == ["embed-0"]


def test_the_table_and_wide_table_show_the_same_rows(seeded: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert fgpuctl(["top", "--kubeconfig", seeded.kubeconfig_path, "-n", "ml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "POD", "NODE", "GPU", "MEMORY(used/alloc)", "PROCESSES"]
    assert lines[2].split() == ["ml", "train-0", "n1", "GPU-n1-00", "32.0Gi/40.0Gi", "2"]
    assert fgpuctl(["top", "--kubeconfig", seeded.kubeconfig_path, "-n", "ml", "-o", "wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert wide[2].split() == ["ml", "train-0", "n1", "GPU-n1-00", "32.0Gi/40.0Gi", "2", "50%", "40%", "uid-train-0"]


def test_an_agent_that_does_not_answer_is_named_and_the_others_still_count(
    seeded: KubeAPIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    seeded.put_object(cluster.PODS.format("fgpu-system"), cluster.agent_pod("n3", 1))  # nothing listens on port 1
    assert fgpuctl(["top", "--kubeconfig", seeded.kubeconfig_path, "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert "http://127.0.0.1:1/metrics: cannot scrape" in err
    assert len(json.loads(out)["pods"]) == 4


def test_metrics_urls_replace_discovery_and_no_agent_is_a_clear_error(
    kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    for row in cluster.GPU_PODS:
        kube_api.put_object(cluster.PODS.format(row[0]), cluster.gpu_pod(*row))
    assert fgpuctl(["top", "--kubeconfig", kube_api.kubeconfig_path]) == 1
    assert "no running fgpu-agent pod in namespace fgpu-system" in capsys.readouterr().err
    gpus, procs = cluster.PROCESSES["n1"]
    with agents(("n1", gpus, procs)) as ports:
        url = f"http://127.0.0.1:{ports['n1']}/metrics"
        rows = _top(kube_api, capsys, "--metrics-url", url)
    # embed-0 is allocated on n2, which was not scraped: it shows its allocation and no use
    assert [(r["pod"], r["memory_used_bytes"]) for r in rows] == [("serve-0", 0), ("train-0", 32 * GiB), ("embed-0", 0)]


def test_top_reads_the_metric_names_the_agent_exports() -> None:
    exported = exported_by_daemon()["fgpu-agent"]
    assert {top.POD_MEMORY, top.POD_PROCESSES, top.GPU_SM, top.GPU_MEMORY_TOTAL} <= exported


def test_agents_are_found_as_running_agent_pods_of_their_namespace() -> None:
    pods = [
        cluster.agent_pod("n1", 9400),
        cluster.agent_pod("n2", 9401, namespace="elsewhere"),
        {**cluster.agent_pod("n3", 9400), "status": {"phase": "Pending"}},
        {**cluster.agent_pod("n4", 9400), "status": {"phase": "Running", "podIP": "fd00::4"}},
    ]
    assert top.agent_urls(pods, namespace="fgpu-system") == {
        "n1": "http://127.0.0.1:9400/metrics", "n4": "http://[fd00::4]:9400/metrics"}
