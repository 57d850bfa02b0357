"""`fgpuctl defrag-plan --kubeconfig`: planning on Devices, pods and PodDisruptionBudgets from the API."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.signing import allocation_annotations
from fgpuctl.main import main as fgpuctl
from tests.fgpuctl_defrag.conftest import KEY
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import GiB, gpu_node, pod

PDB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "poddisruptionbudgets.policy"},
    "spec": {
        "group": "policy",
        "scope": "Namespaced",
        "names": {"plural": "poddisruptionbudgets", "singular": "poddisruptionbudget", "kind": "PodDisruptionBudget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}
PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"


def bound_pod(node: str, name: str, *, core: int, memory_gib: int, cpu: str, labels: dict[str, str]) -> dict[str, Any]:
    uid = str(uuid.uuid4())
    share = GPUShare(
        minor=0, uuid=f"GPU-{node}-00", core_percent=core, memory_bytes=memory_gib * GiB, memory_ratio_percent=memory_gib * 100 // 80
    )
    obj = pod(
        name,
        uid=uid,
        node_name=node,
        labels=labels,
        requests={names.GPU_CORE: str(core), names.GPU_MEMORY: f"{memory_gib}Gi", "cpu": cpu},
        annotations=allocation_annotations(KEY, pod_uid=uid, node_name=node, allocation=Allocation(gpus=(share,))),
    )
    obj["status"] = {"phase": "Running"}
    return obj


def seed(api: KubeAPIServer) -> None:
    """Three 1-GPU nodes; web on n1 and db on n2 share GPUs; n3's GPU is free but its CPU is taken."""
    cluster.install(api)
    api.install_crd(PDB_CRD)
    for name in ("n1", "n2", "n3"):
        cluster.add_node(api, gpu_node(name, gpus=1), cpu="64")
    cluster.add_pod(api, bound_pod("n1", "web-0", core=30, memory_gib=8, cpu="2", labels={"app": "web"}))
    cluster.add_pod(api, bound_pod("n2", "db-0", core=30, memory_gib=8, cpu="2", labels={"app": "db"}))
    batch = pod("batch", node_name="n3", requests={"cpu": "60"}, labels={"app": "batch"})
    batch["status"] = {"phase": "Running"}
    cluster.add_pod(api, batch)


def pdb(name: str, app: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": app}}, **spec},
    }


def plan(api: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> Any:
    argv = ["defrag-plan", "--kubeconfig", api.kubeconfig_path, "--gpus", "1", "--cpu", "8000", "--json"]
    assert fgpuctl(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_budget_read_from_the_api_pins_its_pod_so_the_other_one_moves(
    kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(kube_api)
    kube_api.put_object(PDBS, pdb("web", "web", maxUnavailable=0))
    # Left free, the CPU-only pod on n3 is the one move the shared planner (plan_room) prefers: it
    # holds no GPU, so no GPU pod is disrupted. Pinned, the choice is between the two GPU pods.
    kube_api.put_object(PDBS, pdb("batch", "batch", maxUnavailable=0))

    result = plan(kube_api, capsys)

    # n3's free GPU does not count: the CPU-only pod there leaves 4 of 64 CPUs.
    assert result["before"]["pending_fit"] == 0
    assert [(m["pod"], m["from"]) for m in result["moves"]] == [("default/db-0", "n2")]
    assert result["after"]["pending_fit"] == 1
    assert "2 PodDisruptionBudget(s) respected" in result["notes"]


def test_budgets_that_pin_every_blocking_pod_leave_no_move(kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    seed(kube_api)
    kube_api.put_object(PDBS, pdb("web", "web", maxUnavailable=0))
    kube_api.put_object(PDBS, pdb("db", "db", minAvailable="100%"))
    kube_api.put_object(PDBS, pdb("batch", "batch", maxUnavailable=0))  # else the CPU-only pod moves off n3

    result = plan(kube_api, capsys)

    assert result["moves"] == []
    assert result["after"]["pending_fit"] == 0


def test_without_budgets_the_snapshot_written_holds_the_live_pods_and_nodes(
    kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    seed(kube_api)
    out = tmp_path / "live.json"

    code = fgpuctl(["defrag-plan", "--kubeconfig", kube_api.kubeconfig_path, "--write-snapshot", str(out)])

    assert code == 0, capsys.readouterr().err
    written = json.loads(out.read_text())
    assert {n["name"]: (n["cpu_milli"], n["gpus"], n["model"]) for n in written["nodes"]} == {
        "n1": (64000, 1, "H100-80GB-HBM3"),
        "n2": (64000, 1, "H100-80GB-HBM3"),
        "n3": (64000, 1, "H100-80GB-HBM3"),
    }
    pods = {p["name"]: (p["node"], p["gpus"], p["gpu_milli"], p["cpu_milli"]) for p in written["pods"]}
    assert pods == {"default/web-0": ("n1", [0], 300, 2000), "default/db-0": ("n2", [0], 300, 2000), "default/batch": ("n3", [], 0, 60000)}
    assert written["budgets"] == []


def test_output_yaml_is_the_json_plan_and_a_second_format_is_refused(
    kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    seed(kube_api)
    as_json = plan(kube_api, capsys)
    argv = ["defrag-plan", "--kubeconfig", kube_api.kubeconfig_path, "--gpus", "1", "--cpu", "8000"]

    assert fgpuctl([*argv, "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == as_json
    assert fgpuctl([*argv, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == as_json

    assert fgpuctl([*argv, "--json", "-o", "yaml"]) == 2
    assert "--json and -o yaml: give one output format" in capsys.readouterr().err


def test_an_api_that_refuses_exits_1_as_inspect_does(kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    # No Device CRD installed: the list is a 404, which the operator fixes by installing fgpu.
    code = fgpuctl(["defrag-plan", "--kubeconfig", kube_api.kubeconfig_path, "--gpus", "1"])

    err = capsys.readouterr().err
    assert code == 1, err
    assert "is fgpu's Device CRD installed?" in err
