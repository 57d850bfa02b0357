"""hack/systemd/: the node-side files (systemd units, the hook registration) agree with the components."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from agent import main as agent_main
from agent.config import DEFAULT_HOOK_LISTEN, load_config_file, parse_config
from runtimeproxy import config as proxy_config
from runtimeproxy import hookconfig
from runtimeproxy import main as proxy_main
from tests.localup.manifests import REPO, embedded_yaml

SYSTEMD = REPO / "hack" / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))


def unit_sections(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as section -> key -> values (systemd allows a key more than once)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} before any [Section]"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not Key=Value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def words(values: list[str]) -> set[str]:
    return {w for v in values for w in v.split()}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_every_unit_has_the_three_sections_and_restarts_on_failure(unit: Path) -> None:
    sections = unit_sections(unit)
    assert {"Unit", "Service", "Install"} <= set(sections)
    assert sections["Service"]["Restart"] in (["always"], ["on-failure"])
    assert sections["Install"]["WantedBy"]


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_every_units_command_line_is_accepted_by_its_program(unit: Path) -> None:
    (exec_start,) = unit_sections(unit)["Service"]["ExecStart"]
    argv = shlex.split(exec_start.lstrip("-@+!"))
    program = Path(argv[0]).name
    parsers = {"fgpu-agent": agent_main.build_parser, "fgpu-runtime-proxy": proxy_main.build_parser}
    assert program in parsers, f"{unit.name}: ExecStart runs {program}, not an fgpu daemon"
    parsers[program]().parse_args(argv[1:])  # exits (SystemExit) on an unknown flag


def test_the_proxy_starts_after_containerd_and_before_kubelet() -> None:
    unit = unit_sections(SYSTEMD / "fgpu-runtime-proxy.service")["Unit"]
    assert "containerd.service" in words(unit.get("After", [])) & words(unit.get("Requires", []) + unit.get("BindsTo", []))
    assert "kubelet.service" in words(unit.get("Before", []))


def test_the_agent_unit_starts_before_the_proxy_and_kubelet() -> None:
    unit = unit_sections(SYSTEMD / "fgpu-agent.service")["Unit"]
    assert {"fgpu-runtime-proxy.service", "kubelet.service"} <= words(unit.get("Before", []))


def test_the_hook_registration_points_at_the_agents_hook_socket() -> None:
    (server,) = hookconfig.parse_file(str(SYSTEMD / "10-fgpu-agent-hook.yaml"))
    daemonset_config = parse_config(embedded_yaml("ConfigMap", "fgpu-agent-config", "agent.yaml"))
    assert server.endpoint == daemonset_config.hook_listen == DEFAULT_HOOK_LISTEN
    assert hookconfig.Stage.PRE_CREATE_CONTAINER in server.stages
    # Ignore: only GPU pods wait for the agent (the proxy is fail-closed for them whatever this says).
    assert server.failure_policy is hookconfig.FailurePolicy.IGNORE


def config_flag(unit: str) -> str:
    (exec_start,) = unit_sections(SYSTEMD / unit)["Service"]["ExecStart"]
    argv = shlex.split(exec_start)
    return argv[argv.index("--config") + 1]


def test_the_node_config_files_load_with_their_programs_loaders_and_fit_together() -> None:
    proxy = proxy_config.load_file(str(SYSTEMD / "runtime-proxy.yaml"))
    agent = load_config_file(str(SYSTEMD / "agent.yaml"))
    # Each file says where to install it; that is where its unit reads it.
    assert config_flag("fgpu-runtime-proxy.service") == "/etc/fgpu/runtime-proxy.yaml"
    assert config_flag("fgpu-agent.service") == "/etc/fgpu/agent.yaml"
    for name, target in (("runtime-proxy.yaml", "/etc/fgpu/runtime-proxy.yaml"), ("agent.yaml", "/etc/fgpu/agent.yaml")):
        assert f"hack/systemd/{name} {target}" in (SYSTEMD / name).read_text()
    # The proxy reads the hook registration from where the registration file says to put it.
    assert f"{proxy.hook_config_dir}/10-fgpu-agent.yaml" in (SYSTEMD / "10-fgpu-agent-hook.yaml").read_text()
    (server,) = hookconfig.parse_file(str(SYSTEMD / "10-fgpu-agent-hook.yaml"))
    assert server.endpoint == agent.hook_listen
    # kubelet is pointed at the proxy's listen socket in docs/deploy.md.
    assert f"containerRuntimeEndpoint: {proxy.listen}" in (REPO / "docs" / "deploy.md").read_text()
    assert proxy.backend == "unix:///run/containerd/containerd.sock"
