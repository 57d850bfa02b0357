"""The distribution `pip install .` builds carries every package, data file and console script."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        # the venv's setuptools and mypy (the build's own requirements, installed by .ci/run), not a fresh
        # isolated build environment for each run: the same build, seconds sooner
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        cwd=out,
    )
    (built,) = out.glob("fgpu-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_every_component_package(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for module in ("apis/names.py", "agent/main.py", "scheduler_plugin/main.py", "runtimeproxy/main.py", "fgpuctl/main.py",
                   "webhook/main.py", "apis/pod_check.py", "apis/http1.py"):
        assert module in names, module


def test_the_wheel_holds_generated_code_with_stubs_and_the_default_rules(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for proto in ("device", "hooks", "scheduler"):
        assert f"apis/fgpu/v1/{proto}_pb2.py" in names
        assert f"apis/fgpu/v1/{proto}_pb2.pyi" in names
    assert "apis/rules/default.yaml" in names
    assert "apis/py.typed" in names


def test_the_wheel_declares_every_console_script(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(entry_points).decode())
    assert dict(parser["console_scripts"]) == {
        "fgpu-runtime-proxy": "runtimeproxy.main:main",
        "fgpu-agent": "agent.main:main",
        "fgpu-scheduler": "scheduler_plugin.main:main",
        "fgpu-descheduler": "scheduler_plugin.descheduler.main:main",
        "fgpuctl": "fgpuctl.main:main",
        "kubectl-fgpu": "fgpuctl.kubectl_plugin:main",
        "fgpu-webhook": "webhook.main:main",
    }


def test_the_tests_and_dev_tools_are_not_shipped(wheel: zipfile.ZipFile) -> None:
    assert not [n for n in wheel.namelist() if n.startswith(("tests/", "hack/", "bench/"))]


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler: the wheel is pure Python")
def test_the_wheel_carries_the_compiled_relay_with_its_source_and_the_digest_of_that_source(
    wheel: zipfile.ZipFile,
) -> None:
    names = set(wheel.namelist())
    from runtimeproxy.compiled import DIGEST_FILE, LIBRARY, MODULES, source_digest

    assert any(n.startswith(f"{LIBRARY}__mypyc.") and n.endswith(".so") for n in names), sorted(names)[:20]
    for name in MODULES:
        assert f"runtimeproxy/{name}.py" in names  # the source stays: the fallback where the build is not of it
        assert any(n.startswith(f"runtimeproxy/{name}.") and n.endswith(".so") for n in names), name
    assert wheel.read(f"runtimeproxy/{DIGEST_FILE}").decode().strip() == source_digest()
