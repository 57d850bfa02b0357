"""`fgpuctl defrag-plan --kubeconfig`: node labels, nodeSelector and required node affinity from the API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apis.devices import GPUInfo
from fgpuctl.cluster_state import GPURow, NodeRow
from fgpuctl.live_snapshot import snapshot_from_scheduler
from fgpuctl.main import main as fgpuctl
from tests.fgpuctl_defrag.test_api_source import PDB_CRD, bound_pod
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, pod


def node_fields(*, key: str, values: list[str]) -> dict[str, Any]:
    term = {"matchFields": [{"key": key, "operator": "In", "values": values}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def seed(api: KubeAPIServer, *, db_field: str = "metadata.name") -> None:
    """n1..n3 (zones a..c), one GPU each with a 30% share: web-0 may stay only in zone a, db-0 only go to n3."""
    cluster.install(api)
    api.install_crd(PDB_CRD)
    for name, zone in (("n1", "a"), ("n2", "b"), ("n3", "c")):
        cluster.add_node(api, gpu_node(name, gpus=1), labels={"zone": zone})
    web = bound_pod("n1", "web-0", core=30, memory_gib=8, cpu="2", labels={"app": "web"})
    web["spec"]["nodeSelector"] = {"zone": "a"}
    db = bound_pod("n2", "db-0", core=30, memory_gib=8, cpu="2", labels={"app": "db"})
    db["spec"]["affinity"] = node_fields(key=db_field, values=["n2", "n3"])
    spare = bound_pod("n3", "spare-0", core=30, memory_gib=8, cpu="2", labels={"app": "spare"})
    spare["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["c"]}]}]
            }
        }
    }
    for obj in (web, db, spare):
        cluster.add_pod(api, obj)
    batch = pod("batch", node_name="n3", requests={"cpu": "1"})
    batch["spec"]["nodeSelector"] = {"zone": "c"}
    batch["status"] = {"phase": "Running"}
    cluster.add_pod(api, batch)


def plan(api: KubeAPIServer, capsys: pytest.CaptureFixture[str], *extra: str) -> Any:
    argv = ["defrag-plan", "--kubeconfig", api.kubeconfig_path, "--gpus", "1", "--json", *extra]
    assert fgpuctl(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_live_selectors_and_affinity_decide_which_pod_moves_and_where(
    kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(kube_api)

    result = plan(kube_api, capsys)

    # web-0 (n1 first by name) is held by its selector; db-0 may only go to n3; spare-0 only stay in zone c.
    assert [(m["pod"], m["from"], m["to"]) for m in result["moves"]] == [("default/db-0", "n2", "n3")]
    assert result["opened"] == ["n2"]
    assert any("default/web-0 fits on no other node" in line for line in result["skipped"])
    assert result["before"]["pending_fit"] == 0 and result["after"]["pending_fit"] == 1


def test_the_written_snapshot_carries_node_labels_selectors_and_affinity(
    kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    seed(kube_api)
    out = tmp_path / "live.json"

    plan(kube_api, capsys, "--write-snapshot", str(out))

    written = json.loads(out.read_text())
    assert {n["name"]: n["labels"]["zone"] for n in written["nodes"]} == {"n1": "a", "n2": "b", "n3": "c"}
    pods = {p["name"]: p for p in written["pods"]}
    assert pods["default/web-0"]["node_selector"] == {"zone": "a"}
    assert pods["default/db-0"]["affinity"] == [[{"key": "metadata.name", "operator": "In", "values": ["n2", "n3"]}]]
    assert pods["default/spare-0"]["affinity"] == [[{"key": "zone", "operator": "In", "values": ["c"]}]]
    assert pods["default/batch"]["node_selector"] == {"zone": "c"}
    # Replanning offline on the written snapshot gives the same moves.
    assert fgpuctl(["defrag-plan", "--snapshot", str(out), "--gpus", "1", "--json"]) == 0
    offline = json.loads(capsys.readouterr().out)
    assert [(m["pod"], m["to"]) for m in offline["moves"]] == [("default/db-0", "n3")]


def test_a_pod_with_a_node_field_the_scheduler_cannot_match_is_pinned_with_a_note(
    kube_api: KubeAPIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(kube_api, db_field="metadata.namespace")

    result = plan(kube_api, capsys)

    assert result["moves"] == []
    assert any(
        note.startswith("1 pod(s) pinned: their node selector or affinity could not be read (e.g. default/db-0:")
        for note in result["notes"]
    ), result["notes"]


def test_with_the_scheduler_as_source_a_note_says_selectors_and_affinity_are_not_checked() -> None:
    gpu = GPURow(
        device=GPUInfo(uuid="GPU-0", minor=0, index=0, model="H100", model_label="H100", memory_bytes=1),
        allocated_core_percent=0, allocated_memory_bytes=0, held_externally=False, pods=(),
    )

    live = snapshot_from_scheduler([NodeRow("n1", "", "", (gpu,))])

    assert any("nodeSelector and node affinity unknown with --scheduler" in note for note in live.notes)
    assert live.snapshot.node_labels == {}
