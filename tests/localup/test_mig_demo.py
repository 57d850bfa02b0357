"""The local stack demos dynamic MIG: `hack/local-up.sh --inventory examples/inventories/a100-2x-mig-dynamic.yaml
--pods examples/local-mig` (docs/mig.md), every pod getting an instance of its own or the operator's free one."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.localup.manifests import REPO
from tests.localup.test_local_up import SCRIPT, leftovers, local_up, pytestmark  # noqa: F401  (the same marks)

INVENTORY = REPO / "examples" / "inventories" / "a100-2x-mig-dynamic.yaml"
OPERATORS = "MIG-0c7e4d1a-2b3c-4d5e-8f60-718293a4b5c6"


def test_the_mig_demo_creates_an_instance_per_pod_and_hands_out_the_operators_free_one() -> None:
    path = Path(tempfile.mkdtemp(prefix="fgpu-lu-", dir="/tmp"))
    out = Path(tempfile.mkdtemp(prefix="fgpu-lu-out-")) / "outcome.json"  # the stack's directory is cleaned
    try:
        result = local_up("--workdir", str(path), "--inventory", str(INVENTORY),
                          "--pods", str(REPO / "examples" / "local-mig"), "--json", str(out))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        pods = {p["name"]: p for p in json.loads(out.read_text())["pods"]}
        visible = {name: str(p["env"].get("NVIDIA_VISIBLE_DEVICES", "")) for name, p in pods.items()}
        assert set(pods) == {"mig-small", "mig-large", "mig-existing"}
        assert all(v.startswith("MIG-") for v in visible.values()), visible
        assert len(set(visible.values())) == 3  # one instance each
        assert visible["mig-existing"] == OPERATORS  # 8 GiB: the operator's free 1g.10gb, not a new one
        assert {p["status"] for p in pods.values()} == {"Completed"}
    finally:
        subprocess.run([str(SCRIPT), "--down", "--workdir", str(path)], capture_output=True, timeout=120, check=False)
        assert not leftovers(path)
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(out.parent, ignore_errors=True)
