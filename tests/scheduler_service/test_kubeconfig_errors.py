"""A kubeconfig the client cannot use gets one line naming --kubeconfig, the file and the fix.

Whatever the kubernetes client's loader raises for it (its ConfigException, a YAML parser error,
or a TypeError from indexing YAML that is a list or a string), the scheduler's and the agent's
`Kube.connect` raise their KubeAPIError; every command that connects says it on one line and
exits non-zero, without a traceback.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.errors import KubeAPIError as AgentKubeAPIError
from agent.kube import Kube as AgentKube
from fgpuctl.main import main as fgpuctl_main
from scheduler_plugin.errors import KubeAPIError
from scheduler_plugin.kube import Kube
from tests.signing_keys import signing_key, write_signing_key

BIN = Path(sys.executable).parent

KUBECONFIGS = {
    "cut-off-yaml": b"apiVersion: v1\nclusters: [\n",
    "tab-indented": b"apiVersion: v1\nclusters:\n\t- name: a\n",
    "a-yaml-list": b"- apiVersion: v1\n- clusters: []\n",
    "a-yaml-string": b"just some words\n",
    "a-number": b"42\n",
    "not-utf8": b"\xff\xfe\x00\x01",
    "empty": b"",
    "no-contexts": b"apiVersion: v1\nkind: Config\n",
}


@pytest.fixture(params=sorted(KUBECONFIGS))
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    path = tmp_path / "kube config"  # a space: the suggested kubectl command quotes it
    path.write_bytes(KUBECONFIGS[request.param])
    return str(path)


def _one_line_naming(message: str, path: str) -> None:
    assert "\n" not in message
    assert f"--kubeconfig={path!r}: cannot load a Kubernetes client config (" in message
    assert f"kubectl --kubeconfig {shlex.quote(path)} config view" in message


@pytest.mark.parametrize("connect", [Kube.connect, AgentKube.connect], ids=["scheduler", "agent"])
def test_connect_to_an_unusable_kubeconfig_raises_one_line_naming_the_flag_and_file(
    broken: str, connect: Callable[..., object]
) -> None:
    with pytest.raises((KubeAPIError, AgentKubeAPIError)) as caught:
        connect(kubeconfig=broken)

    _one_line_naming(str(caught.value), broken)


def test_yaml_of_another_shape_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("- a\n- b\n")

    with pytest.raises(KubeAPIError, match="its YAML does not have a kubeconfig's shape"):
        Kube.connect(kubeconfig=str(path))


def test_without_a_flag_the_default_kubeconfig_is_named_and_the_flag_suggested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nclusters: [\n")
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    with pytest.raises(KubeAPIError, match=r"^no --kubeconfig given, .*\$KUBECONFIG.*give a valid kubeconfig with --kubeconfig FILE$"):
        Kube.connect()


BAD = "apiVersion: v1\nclusters: [\n"


@pytest.mark.parametrize(
    "argv",
    [["defrag-plan"], ["mig", "enable", "n1", "0"], ["inspect", "-o", "json"], ["top"]],
    ids=["defrag-plan", "mig", "inspect", "top"],
)
def test_fgpuctl_verbs_say_it_once_and_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(BAD)

    code = fgpuctl_main([*argv, "--kubeconfig", str(path)])

    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.count("--kubeconfig") == 2, err  # the flag, and the suggested kubectl command
    _one_line_naming(err.splitlines()[-1], str(path))


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)


def test_the_scheduler_daemon_exits_with_one_line_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(BAD)
    key = write_signing_key(str(tmp_path / "signing-key"), signing_key("kubeconfig-errors"))

    ran = _run([
        str(BIN / "fgpu-scheduler"), "--state", "kubernetes", "--signing-key", key, "--kubeconfig", str(path),
        "--grpc-listen", f"unix://{tmp_path}/s.sock",
    ])

    assert ran.returncode != 0 and "Traceback" not in ran.stderr, ran.stderr
    _one_line_naming(ran.stderr.strip().splitlines()[-1], str(path))


def test_the_agent_exits_with_one_line_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(BAD)
    inventory = Path(__file__).resolve().parents[2] / "examples" / "inventories" / "h100-8x-nvlink.yaml"

    ran = _run([
        str(BIN / "fgpu-agent"), "--fake-nvml", str(inventory), "--once", "--node-name", "n1", "--kubeconfig", str(path),
    ])

    assert ran.returncode != 0 and "Traceback" not in ran.stderr, ran.stderr
    _one_line_naming(ran.stderr.strip().splitlines()[-1], str(path))
