"""External HTTP/2 load (h2load) through the proxy: the benchmark's run, small, with not one error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.runtimeproxy.h2conformance.rig import ROOT

pytestmark = pytest.mark.containerd


def test_h2load_gets_every_version_call_answered_directly_and_through_the_proxy() -> None:
    if shutil.which("h2load") is None:
        pytest.skip("h2load is not installed (apt-get install nghttp2-client)")
    if shutil.which("containerd") is None or os.geteuid() != 0:
        pytest.skip("needs containerd and root")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "proxy_h2load.py"), "--json", "--rounds", "1",
         "--requests", "5000", "--warmup", "1000"],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    for side in ("direct", "proxy"):
        assert result[side]["errors"] == 0, result
        assert result[side]["requests"] == 5000
        assert result[side]["median_rps"] > 0
