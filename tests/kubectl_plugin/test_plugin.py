"""`kubectl fgpu`: fgpuctl's verbs behind kubectl's flags (--kubeconfig, --context, -n, -o json|yaml|wide)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fgpuctl import kubecontext, kubectl_plugin
from fgpuctl.main import main as fgpuctl
from tests.kubeapi.server import KubeAPIServer
from tests.kubectl_plugin import cluster
from tests.scheduler_service import cluster as gpu_cluster
from tests.scheduler_service.builders import gpu_node

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "pods"


@pytest.fixture
def seeded(kube_api: KubeAPIServer, agent_ports: dict[str, int]) -> KubeAPIServer:
    gpu_cluster.install(kube_api)
    for node in ("n1", "n2"):
        gpu_cluster.add_node(kube_api, gpu_node(node, gpus=2))
    cluster.seed(kube_api, agent_ports)
    return kube_api


def two_contexts(api: KubeAPIServer, tmp_path: Path) -> Path:
    """A kubeconfig whose current context is a dead server; context `double` is the API double."""
    config = yaml.safe_load(Path(api.kubeconfig_path).read_text())
    config["clusters"].append({"name": "dead", "cluster": {"server": "http://127.0.0.1:1"}})
    config["contexts"] = [
        {"name": "dead", "context": {"cluster": "dead", "user": "fgpu-test"}},
        {"name": "double", "context": {"cluster": "fgpu-double", "user": "fgpu-test"}},
    ]
    config["current-context"] = "dead"
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    return path


def plugin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = kubectl_plugin.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_context_picks_the_cluster_as_kubectl_would(seeded: KubeAPIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(two_contexts(seeded, tmp_path))
    code, out, _ = plugin(capsys, "top", "--kubeconfig", config, "--context", "double", "-n", "web", "-o", "yaml")
    assert code == 0
    assert [(r["namespace"], r["pod"]) for r in yaml.safe_load(out)["pods"]] == [("web", "embed-0")]
    code, _, err = plugin(capsys, "top", "--kubeconfig", config)  # the current context: the dead server
    assert code == 1 and "Kubernetes API unreachable" in err and "port=1" in err


def test_flags_may_come_before_the_verb_and_kubeconfig_comes_from_KUBECONFIG(
    seeded: KubeAPIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = two_contexts(seeded, tmp_path)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}{os.pathsep}{config}")
    code, out, _ = plugin(capsys, "--context", "double", "-o", "json", "-n", "ml", "top")
    assert code == 0
    assert [r["pod"] for r in json.loads(out)["pods"]] == ["serve-0", "train-0"]


def test_an_unknown_context_is_refused_naming_the_ones_there(seeded: KubeAPIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = plugin(capsys, "inspect", "--kubeconfig", str(two_contexts(seeded, tmp_path)), "--context", "prod")
    assert code == 2
    assert "--context=prod: no such context in the kubeconfig; it has dead, double" in err


def test_inspect_as_yaml_is_fgpuctls_json(seeded: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert fgpuctl(["inspect", "--kubeconfig", seeded.kubeconfig_path, "-o", "json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    code, out, _ = plugin(capsys, "inspect", "--kubeconfig", seeded.kubeconfig_path, "-o", "yaml")
    assert code == 0 and yaml.safe_load(out) == expected
    assert [g["pods"][0]["name"] for n in expected["nodes"] for g in n["gpus"] if g["pods"]] == ["serve-0", "embed-0"]
    code, out, _ = plugin(capsys, "inspect", "--kubeconfig", seeded.kubeconfig_path, "-o", "wide")
    assert code == 0 and out.startswith("NODE ") and "ml/train-0(50%,40.0Gi)" in out


def test_defrag_plan_as_json_is_fgpuctls_plan(seeded: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["defrag-plan", "--kubeconfig", seeded.kubeconfig_path, "--gpus", "2"]
    assert fgpuctl([*argv, "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    code, out, _ = plugin(capsys, *argv, "-o", "json")
    assert code == 0 and json.loads(out) == expected
    assert expected["pending"]["gpus"] == 2


def test_validate_prints_a_list_and_keeps_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plugin(
        capsys, "validate", "-f", str(EXAMPLES / "valid/nvidia-whole.yaml"), "-f", str(EXAMPLES / "invalid/core-alone.yaml"), "-o", "yaml"
    )
    assert code == 1
    doc = yaml.safe_load(out)
    assert doc["kind"] == "List"
    assert [item["valid"] for item in doc["items"]] == [True, False]
    assert "core alone is invalid" in doc["items"][1]["errors"][0]


def test_unknown_verbs_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = plugin(capsys, "simulate")
    assert code == 2 and "unknown verb 'simulate'; choose from inspect, validate, defrag-plan, top" in err
    code, out, _ = plugin(capsys, "--help")
    assert code == 0 and "top " in out
    with pytest.raises(SystemExit) as exited:
        kubectl_plugin.main(["top", "--help"])
    assert exited.value.code == 0 and "--metrics-url" in capsys.readouterr().out


def test_merged_kubeconfigs_resolve_relative_paths_and_let_the_first_file_win(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first = tmp_path / "a/config"
    first.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://a", "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": {"client-key": "/abs/key.pem", "client-certificate": "certs/u.crt"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))
    second = tmp_path / "config"
    second.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://b"}}, {"name": "d", "cluster": {"server": "https://d"}}],
        "contexts": [{"name": "y", "context": {"cluster": "d"}}],
        "current-context": "y",
    }))
    merged = kubecontext.merged_kubeconfig([first, second])
    assert merged["clusters"] == [
        {"name": "c", "cluster": {"server": "https://a", "certificate-authority": str(tmp_path / "a/ca.crt")}},
        {"name": "d", "cluster": {"server": "https://d"}},
    ]
    assert merged["users"][0]["user"] == {"client-key": "/abs/key.pem", "client-certificate": str(tmp_path / "a/certs/u.crt")}
    assert [c["name"] for c in merged["contexts"]] == ["x", "y"] and merged["current-context"] == "x"


def test_kubectl_finds_the_plugin_on_path(seeded: KubeAPIServer, capsys: pytest.CaptureFixture[str]) -> None:
    kubectl = shutil.which("kubectl")
    script = Path(sys.executable).parent / "kubectl-fgpu"
    if kubectl is None or not script.exists():
        if os.environ.get("CI"):
            raise AssertionError(f"kubectl ({kubectl}) or the kubectl-fgpu console script ({script}) is missing")
        pytest.skip("kubectl or the installed kubectl-fgpu console script is missing")
    env = {**os.environ, "PATH": f"{script.parent}{os.pathsep}{os.environ['PATH']}", "KUBECONFIG": seeded.kubeconfig_path}
    listed = subprocess.run([kubectl, "plugin", "list"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert str(script) in listed.stdout
    done = subprocess.run([kubectl, "fgpu", "top", "-n", "ml", "-o", "json"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert [r["pod"] for r in json.loads(done.stdout)["pods"]] == ["serve-0", "train-0"]
