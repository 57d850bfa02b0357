"""Isolation backends register themselves: discovery, the declared paths and variables, a backend
added in one module (the walkthrough's `visible-only`) reaching the config, both CLIs, the backend
check, the hook and its cleanup, and every kind of edit reaching the hook's answer."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from agent import backendcheck
from agent.config import parse_config
from agent.errors import ConfigError
from agent.hook import decide
from agent.hookserver import GPUHookServicer
from agent.isolation import registry
from agent.isolation.edits import BackendEdits
from agent.isolation.readiness import Machine
from agent.isolation.registry import BackendDiscoveryError, IsolationPaths, PathKey
from agent.main import build_parser
from apis import container_edits, names
from apis.container_edits import CgroupResources, ContainerEdits, DeviceNode, Mount, Propagation
from apis.fgpu.v1 import hooks_pb2
from hack.localup import demo
from tests.agent.test_backendcheck import FakeFiles
from tests.agent.test_hook import _devices, _request, _settings, _share, _signed

ROOT = Path(__file__).resolve().parents[2]
X86 = Machine(name="x86_64", bits=64, little_endian=True)


@pytest.fixture
def walkthrough() -> Iterator[ModuleType]:
    """The walkthrough backend, registered only while the test runs."""
    from tests.agent import isolation_walkthrough

    registry.register_backend(  # registered again: a second test needs it after the first unregistered it
        isolation_walkthrough.NAME, summary="visibility only, through CDI (a test's walkthrough backend)",
        edits=isolation_walkthrough.edits, check=isolation_walkthrough.check,
        on_pod_stopped=isolation_walkthrough.on_pod_stopped, remove_leftovers=isolation_walkthrough.remove_leftovers,
        path_keys=(isolation_walkthrough.STATE_ROOT,), enforces_limits=False, replace=True,
    )
    try:
        yield isolation_walkthrough
    finally:
        registry.unregister_backend(isolation_walkthrough.NAME)


def test_the_builtin_backends_are_found_by_discovery_alone() -> None:
    assert [b.name for b in registry.backends() if b.builtin] == [
        names.ISOLATION_HAMI_CORE, names.ISOLATION_MPS, names.ISOLATION_NONE,
    ]
    assert {b.module for b in registry.backends() if b.builtin} == {
        "agent.isolation.hami_core", "agent.isolation.mps", "agent.isolation.none",
    }


def test_the_builtin_backends_declare_every_variable_their_libraries_read() -> None:
    prefixes = {p for b in registry.backends() for p in b.env_prefixes}
    assert prefixes == set(names.ISOLATION_ENV_PREFIXES)
    for name in (names.HAMI_REDIRECT, names.HAMI_DISABLE_CONTROL, "CUDA_DEVICE_MEMORY_LIMIT_3", names.MPS_PIPE_DIRECTORY):
        assert [b.name for b in registry.iter_env_readers(name)] != [], name


def test_every_path_key_is_a_config_key_with_its_default() -> None:
    config = parse_config({})
    keys = config.isolation_paths.as_keys()
    assert keys == {k.key: k.default for k in registry.path_keys()}
    assert keys["hamiLibrary"] == config.isolation_paths.hami_library == "/usr/local/vgpu/libvgpu.so"
    with pytest.raises(ConfigError, match=r"unknown key 'hamiLibary'; known keys are .*hamiLibrary.*mpsPipeDir"):
        parse_config({"isolationPaths": {"hamiLibary": "/x.so"}})


def test_isolation_paths_are_frozen_and_refuse_a_path_no_backend_declares() -> None:
    paths = IsolationPaths(mps_pipe_dir="/run/mps")
    assert paths == IsolationPaths.from_keys({"mpsPipeDir": "/run/mps"}) != IsolationPaths()
    assert hash(paths) == hash(IsolationPaths.from_keys({"mpsPipeDir": "/run/mps"}))
    with pytest.raises(TypeError, match="unexpected keyword argument 'mps_pipe'"):
        IsolationPaths(mps_pipe="/run/mps")
    with pytest.raises(AttributeError):
        paths.mps_pipe_dir = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="no isolation backend declares a path 'gpu_dir'"):
        _ = paths.gpu_dir


def test_a_backend_in_one_module_reaches_the_config_both_clis_and_the_backend_check(walkthrough: ModuleType) -> None:
    config = parse_config({"isolation": "visible-only", "isolationPaths": {"visibleOnlyStateRoot": "/srv/v"}})
    assert config.isolation == "visible-only"
    assert config.isolation_paths[walkthrough.STATE_ROOT] == "/srv/v"
    assert build_parser().parse_args(["--isolation", "visible-only"]).isolation == "visible-only"
    assert demo.build_parser(str(ROOT)).parse_args(["--isolation", "visible-only"]).isolation == "visible-only"
    status = backendcheck.check("visible-only", config.isolation_paths, files=FakeFiles(), machine=X86)
    assert (status.isolation, status.ready, status.reason) == ("visible-only", True, "NoLimits")


def test_an_unregistered_backend_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"isolation='visible-only' is not an isolation backend; use one of hami-core, mps, none"):
        parse_config({"isolation": "visible-only"})


def test_the_hook_gives_a_share_the_walkthrough_backends_edits_and_its_cleanup_runs_at_pod_stop(
    walkthrough: ModuleType, tmp_path: Path
) -> None:
    devices = _devices()
    paths = IsolationPaths.from_keys({"visibleOnlyStateRoot": str(tmp_path / "state")})
    settings = replace(_settings("visible-only"), paths=paths, backend_problem="ignored: it enforces no limit")
    decision = decide(_request(_signed(_share(devices, 0))), devices=devices, settings=settings)
    assert decision.edits is not None, decision.rejection
    env = dict(decision.edits.envs)
    assert env[names.FGPU_ISOLATION] == "visible-only"
    assert names.CUDA_VISIBLE_DEVICES not in env  # like none: it indexes no limit by CUDA ordinal
    assert decision.edits.cdi_devices == (f"nvidia.com/gpu={devices.gpus[0].uuid}",)

    servicer = GPUHookServicer(devices=lambda: devices, settings=lambda: settings)
    response = servicer._response(decision)
    assert list(response.add_cdi_devices) == [f"nvidia.com/gpu={devices.gpus[0].uuid}"]
    assert [(d.container_path, d.permissions) for d in response.add_devices] == [("/dev/nvidia-uvm", "rw")]
    assert dict(response.resources.unified) == {"pids.max": "4096"}
    assert not response.resources.HasField("memory_limit_in_bytes")
    state = tmp_path / "state" / _request({}).pod_uid
    assert state.is_dir()  # a host directory the hook server made before answering

    pod = hooks_pb2.PodSandboxMeta(uid=_request({}).pod_uid, namespace="ml", name="trainer-0")
    servicer.PostStopPodSandbox(hooks_pb2.PodSandboxHookRequest(pod=pod), None)  # type: ignore[arg-type]
    assert not state.exists()


def test_every_kind_of_container_edit_reaches_the_hooks_answer() -> None:
    edits = ContainerEdits(
        envs=(("A", "1"),),
        unset_envs=("B",),
        mounts=(Mount("/c", "/h", readonly=False, selinux_relabel=True, propagation=Propagation.HOST_TO_CONTAINER),),
        devices=(DeviceNode("/dev/x", "/dev/y", "r"),),
        cdi_devices=("vendor.com/dev=1",),
        set_annotations=(("k", "v"),),
        remove_annotations=("old",),
        resources=CgroupResources(cpu_shares=2, cpuset_cpus="0-1", unified={"dmem.max": "1"}),
    )
    response = container_edits.to_proto(edits)
    answered = {f.name for f in hooks_pb2.HookResponse.DESCRIPTOR.fields if f.name != "rejection"}
    # One ContainerEdits field per kind the protocol carries.
    assert len(dataclasses.fields(ContainerEdits)) == len(answered)
    for name in answered:
        try:
            present = response.HasField(name)  # a singular message (resources)
        except ValueError:
            present = len(getattr(response, name)) > 0  # repeated fields and maps
        assert present, f"ContainerEdits has no way to say {name}, or the hook server drops it"
    mount = response.add_mounts[0]
    assert (mount.readonly, mount.selinux_relabel, mount.propagation) == (
        False, True, hooks_pb2.PROPAGATION_HOST_TO_CONTAINER,
    )
    assert (response.resources.cpu_shares, response.resources.cpuset_cpus) == (2, "0-1")
    assert not response.resources.HasField("cpu_quota")
    assert dict(response.set_annotations) == {"k": "v"} and list(response.remove_annotations) == ["old"]


def _package(tmp_path: Path, name: str, modules: dict[str, str]) -> str:
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    return name


_REGISTERS = """
from agent.isolation.readiness import BackendStatus
from agent.isolation.edits import BackendEdits
from agent.isolation.registry import register_backend

register_backend(
    "{name}", summary="test", edits=lambda gpus, **_: BackendEdits(),
    check=lambda paths, **_: BackendStatus("{name}", True, "NoLimits", ""),
)
"""


def test_discovery_imports_every_module_but_the_helpers_and_fails_loudly_on_one_that_registers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, "isolation_found", {"zero": _REGISTERS.format(name="test-zero"), "edits": "raise RuntimeError"})
    try:
        assert [b.name for b in registry.discover(package)] == ["test-zero"]
    finally:
        registry.unregister_backend("test-zero")
    bad = _package(tmp_path, "isolation_bad", {"helper": "X = 1\n"})
    with pytest.raises(BackendDiscoveryError, match=r"isolation module isolation_bad\.helper registered no backend"):
        registry.discover(bad)
    for name in ("isolation_found", "isolation_bad"):
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def test_a_path_key_or_a_name_taken_by_another_backend_is_refused() -> None:
    def edits(gpus: object, **_: object) -> BackendEdits:
        return BackendEdits()

    check = registry.backend(names.ISOLATION_NONE).check
    with pytest.raises(ValueError, match=r"path key\(s\) \['mpsPipeDir'\] already belong to backend 'mps'"):
        registry.register_backend("test-clash", summary="", edits=edits, check=check, path_keys=(PathKey("mpsPipeDir", "/x", ""),))
    with pytest.raises(ValueError, match="'mps' is already registered; pass replace=True"):
        registry.register_backend(names.ISOLATION_MPS, summary="", edits=edits, check=check)
    assert "test-clash" not in registry.backend_names()
    assert registry.backend(names.ISOLATION_MPS).module == "agent.isolation.mps"
