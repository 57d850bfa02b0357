"""The relay compiled with mypyc (setup.py), and the same relay as Python where the build is not of the source.

`pip install -e .` (what .ci/run does) compiles the relay when a C compiler is
there; these tests skip where it is not. The daemon says which one runs in its
"runtime proxy serving" line.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from apis.names import PURE_PYTHON_ENV
from runtimeproxy.compiled import DIGEST_FILE, MODULES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "runtimeproxy"

compiled_here = pytest.mark.skipif(
    not glob.glob(str(PACKAGE / f"{MODULES[0]}.*.so")), reason="the relay is not compiled here (no C compiler at install)"
)

# Imports the relay in a fresh interpreter, relays a preface and a SETTINGS frame through a connection
# with recording transports, and prints how it runs and what reached the runtime.
_PROBE = """
import runtimeproxy
from runtimeproxy import compiled, request_pump
from runtimeproxy.calls import StreamKind
from runtimeproxy.relay_state import ConnectionState

class T:
    def __init__(self): self.out = []
    def write(self, d): self.out.append(bytes(d))
    def close(self): pass
    def pause_reading(self): pass
    def resume_reading(self): pass
    def get_extra_info(self, name, default=None): return default

class Handler:
    def classify(self, path): return StreamKind.PASS
    def finished(self, *args): pass

class Relay:
    handler = Handler()
    backend_name = "runtime"
    def __init__(self): self.connections = set()
    def on_backend_connect(self, ok): pass

conn = ConnectionState(Relay(), T())
backend = T()
conn.set_backend(backend)
frames = b"PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n" + b"\\x00\\x00\\x00\\x04\\x00\\x00\\x00\\x00\\x00"
request_pump.pump(conn, frames)
print(compiled.build)
print(request_pump.__file__)
print(b"".join(backend.out) == frames)
"""


def _probe(package_parent: str, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=package_parent, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": package_parent, **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@compiled_here
def test_the_relay_runs_compiled_where_it_was_built() -> None:
    build, module, relayed = _probe(str(ROOT))
    assert build == "compiled"
    assert module.endswith(".so")
    assert relayed == "True"


@compiled_here
def test_a_changed_source_runs_as_python_until_it_is_rebuilt(tmp_path: Path) -> None:
    # a copy of the installed tree: the package with its compiled modules, and the library beside it
    shutil.copytree(PACKAGE, tmp_path / "runtimeproxy", ignore=shutil.ignore_patterns("__pycache__"))
    for library in glob.glob(str(ROOT / "*__mypyc.*.so")):
        shutil.copy(library, tmp_path)
    assert _probe(str(tmp_path))[0] == "compiled"

    # touched but unchanged (a checkout of the same commit): still the compiled build
    os.utime(tmp_path / "runtimeproxy" / "request_pump.py")
    assert _probe(str(tmp_path))[0] == "compiled"

    # changed: every relay module comes from source, and relays as before
    with open(tmp_path / "runtimeproxy" / "h2frames.py", "a") as f:
        f.write("\n# changed after the build\n")
    build, module, relayed = _probe(str(tmp_path))
    assert build.startswith("python (the compiled build is not of this source")
    assert module == str(tmp_path / "runtimeproxy" / "request_pump.py")
    assert relayed == "True"

    # no record of what was compiled: the same
    with open(tmp_path / "runtimeproxy" / "h2frames.py", "w") as f:
        f.write((PACKAGE / "h2frames.py").read_text())
    (tmp_path / "runtimeproxy" / DIGEST_FILE).unlink()
    assert _probe(str(tmp_path))[0].startswith("python (the compiled build is not of this source")


@compiled_here
def test_the_python_relay_passes_the_frame_conformance_tests() -> None:
    """FGPU_PURE_PYTHON=1 runs the source where it was compiled: the same cases, in-process and in the proxy.

    All but the fuzz, h2load and reset cases (CI's time): those run compiled.
    """
    assert _probe(str(ROOT), {PURE_PYTHON_ENV: "1"})[0] == f"python ({PURE_PYTHON_ENV}=1)"
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", f"cache_dir={cache}",
             "tests/runtimeproxy/h2conformance", "-k", "not fuzz and not external_load and not test_resets"],
            cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, PURE_PYTHON_ENV: "1"},
        )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout


def test_the_daemon_says_how_its_relay_runs_and_on_which_event_loop(tmp_path: Path) -> None:
    listen = tmp_path / "proxy.sock"
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    log = tmp_path / "proxy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runtimeproxy.main", "--listen", f"unix://{listen}",
             "--backend", f"unix://{tmp_path / 'absent.sock'}", "--hook-config-dir", str(hooks),
             "--admin-listen", "", "--metrics-listen", "", "--log-level", "info"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 20
        while "runtime proxy serving" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(10)
    line = next(x for x in log.read_text().splitlines() if "runtime proxy serving" in x)
    compiled = bool(glob.glob(str(PACKAGE / f"{MODULES[0]}.*.so")))
    assert ("relay_build=compiled" if compiled else "relay_build=python") in line
    assert "event_loop=uvloop" in line
