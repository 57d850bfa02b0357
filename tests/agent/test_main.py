"""`fgpu-agent` from the command line: --once --print with no cluster, settings and their errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.config import AgentConfig, parse_config, resolve_node_name, with_overrides
from agent.errors import ConfigError
from agent.main import main
from apis import names
from tests.agent.helpers import A100_MIG, H100, MIXED, ROOT, T4


def test_once_print_device_prints_the_device_object_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fake-nvml", H100, "--once", "--print", "device", "--node-name", "h100-node"]) == 0
    device = json.loads(capsys.readouterr().out)
    assert device["kind"] == names.DEVICE_KIND and device["metadata"]["name"] == "h100-node"
    assert len(device["spec"]["devices"]) == 8
    extras = json.loads(device["metadata"]["annotations"][names.DEVICE_EXTRAS])
    assert all(len(g["nvlinkPeers"]) == 4 for g in extras["gpus"].values())


def test_once_print_node_prints_labels_and_extended_resources(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fake-nvml", A100_MIG, "--once", "--print", "node", "--node-name", "a100"]) == 0
    node = json.loads(capsys.readouterr().out)
    assert node["metadata"]["labels"][names.NODE_GPU_MODEL] == "A100-SXM4-80GB"
    assert node["status"]["capacity"][names.GPU_CORE] == "400"


def test_the_node_name_comes_from_the_flag_then_the_downward_api_then_the_hostname() -> None:
    assert resolve_node_name(AgentConfig(node_name="flag"), environ={"NODE_NAME": "env"}) == "flag"
    assert resolve_node_name(AgentConfig(), environ={"NODE_NAME": "env"}) == "env"
    assert resolve_node_name(AgentConfig(), environ={}) == os.uname().nodename


def test_the_console_script_runs_with_no_cluster_in_a_fresh_process() -> None:
    env = {**os.environ, "NODE_NAME": "from-env"}
    out = subprocess.run(
        [sys.executable, "-m", "agent.main", "--fake-nvml", MIXED, "--once", "--print", "device"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    device = json.loads(out)
    assert device["metadata"]["name"] == "from-env"
    assert [d["id"][:4] for d in device["spec"]["devices"]] == ["GPU-"] * 3


def test_a_broken_inventory_exits_2_with_the_field_named(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    path = f"{tmp_path}/bad.yaml"
    with open(path, "w") as f:
        f.write("gpus:\n  - {uuid: GPU-1, name: x, memory: 1Gi, busId: nope}\n")
    assert main(["--fake-nvml", path, "--once", "--print", "device"]) == 2
    assert "gpus[0].busId: 'nope' is not a PCI bus id" in capsys.readouterr().err


def test_print_without_once_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fake-nvml", T4, "--print", "device"]) == 2
    assert "--print needs --once" in capsys.readouterr().err


def test_nvml_failing_in_once_mode_still_prints_a_device_with_no_gpus(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    path = f"{tmp_path}/nodriver.yaml"
    with open(path, "w") as f:
        f.write("init: DriverNotLoaded\ngpus: []\n")
    assert main(["--fake-nvml", path, "--once", "--print", "device", "--node-name", "n"]) == 0
    device = json.loads(capsys.readouterr().out)
    assert device["spec"]["devices"] == []
    assert "DriverNotLoaded" in json.loads(device["metadata"]["annotations"][names.DEVICE_EXTRAS])["discoveryError"]


def test_the_config_file_takes_durations_paths_and_backends() -> None:
    config = parse_config(
        {
            "pollInterval": "500ms",
            "healthQuietPeriod": "5m",
            "isolation": "mps",
            "applicationXids": [13, 43],
            "isolationPaths": {"mpsPipeDir": "/run/mps"},
            "advertiseNvidiaGPU": True,
        }
    )
    assert (config.poll_interval_s, config.health_quiet_period_s) == (0.5, 300.0)
    assert config.isolation == names.ISOLATION_MPS and config.isolation_paths.mps_pipe_dir == "/run/mps"
    assert config.application_xids == frozenset({13, 43}) and config.advertise_nvidia_gpu


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"pollIntervall": "1s"}, "unknown key 'pollIntervall'"),
        ({"pollInterval": "soon"}, "pollInterval='soon': not a duration"),
        ({"pollInterval": 0}, "pollInterval=0: must be more than zero; write e.g. 1s"),
        ({"isolation": "gvisor"}, "'gvisor' is not an isolation backend; use one of hami-core, mps, none"),
        ({"hookListen": "unix://relative.sock"}, "needs an absolute path"),
        ({"isolationPaths": {"hamiLibrary": "libvgpu.so"}}, "must be an absolute path"),
        ({"applicationXids": "13"}, "must be a list of Xid numbers"),
    ],
)
def test_a_bad_setting_is_refused_naming_key_value_and_fix(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(data)


def test_flags_override_the_config_file() -> None:
    config = with_overrides(parse_config({"isolation": "mps", "nodeName": "file"}), isolation="none", node_name=None)
    assert config.isolation == names.ISOLATION_NONE and config.node_name == "file"
