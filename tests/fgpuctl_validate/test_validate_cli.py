"""`fgpuctl validate`: one JSON line per pod, and exit 0 (all valid), 1 (any invalid), 2 (unreadable)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fgpuctl.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pods"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str], stdin: str | None = None) -> tuple[int, list[dict[str, object]], str]:
    if stdin is not None:
        sys.stdin = io.StringIO(stdin)
    try:
        code = main(["validate", *args])
    finally:
        sys.stdin = sys.__stdin__
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_all_valid_examples_exit_0_with_one_line_per_pod(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in (EXAMPLES / "valid").iterdir())
    code, lines, err = run_cli([arg for f in files for arg in ("-f", f)], capsys)
    assert code == 0
    assert all(line["valid"] is True for line in lines)
    pods = [line["pod"] for line in lines]
    assert "ml/share-memory" in pods and "serving/inference-a" in pods and "serving/inference-b" in pods
    share = next(line for line in lines if line["pod"] == "ml/share-memory")
    assert share["request"] == {
        "gpus": 1, "core_percent": 50, "memory_bytes": 10 * 2**30, "memory_ratio_percent": None, "whole": False,
        "source": "koordinator",
    }
    assert next(line for line in lines if line["pod"] == "ml/cpu-only")["request"] is None
    assert "skipped Service ml/train" in err


def test_a_workload_is_checked_through_its_pod_template(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run_cli(["-f", str(EXAMPLES / "valid" / "training-job.yaml")], capsys)
    assert code == 0
    assert lines == [{"pod": "ml/train", "kind": "Job", "valid": True, "request": {
        "gpus": 4, "core_percent": 100, "memory_bytes": None, "memory_ratio_percent": 100, "whole": True, "source": "nvidia"}}]


def test_any_invalid_pod_exits_1_and_lists_its_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run_cli(
        ["-f", str(EXAMPLES / "valid" / "nvidia-whole.yaml"), "-f", str(EXAMPLES / "invalid" / "percent-150.yaml")], capsys
    )
    assert code == 1
    assert [line["valid"] for line in lines] == [True, False]
    errors = lines[1]["errors"]
    assert isinstance(errors, list) and len(errors) == 2
    assert errors[0].startswith('container "main": koordinator.sh/gpu-core=150: ')


def test_every_invalid_example_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    for path in sorted((EXAMPLES / "invalid").iterdir()):
        code, lines, _ = run_cli(["-f", str(path)], capsys)
        assert (code, [line["valid"] for line in lines]) == (1, [False]), path.name


def test_a_bad_cpu_quantity_makes_the_pod_invalid(capsys: pytest.CaptureFixture[str]) -> None:
    manifest = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "fast"}}}]}}
    code, lines, _ = run_cli(["-f", "-"], capsys, stdin=json.dumps(manifest))
    assert code == 1
    assert lines == [{"pod": "default/p", "valid": False, "errors": [
        'container "c": cpu=fast: is not a quantity; write e.g. 500m or 2 for cpu, 512Mi or 4Gi for memory']}]


UNREADABLE = [
    pytest.param("kind: Pod\nmetadata: {name: [\n", "not valid YAML or JSON", id="broken-yaml"),
    pytest.param("- 1\n- 2\n", "expected a Kubernetes object", id="not-an-object"),
    pytest.param("", "no Pod found", id="empty"),
    pytest.param("kind: Service\nmetadata: {name: s}\n", "no Pod found", id="no-pod"),
    pytest.param("kind: List\nitems: 3\n", "a List needs 'items: [...]'", id="list-without-items"),
]


@pytest.mark.parametrize(("text", "fragment"), UNREADABLE)
def test_unreadable_input_exits_2_with_a_message(text: str, fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = run_cli([], capsys, stdin=text)
    assert (code, lines) == (2, [])
    assert fragment in err


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["-f", str(tmp_path / "nope.yaml")], capsys)
    assert code == 2 and "nope.yaml: cannot read" in err


def test_custom_rules_are_used_and_bad_rules_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nrules:\n  - name: acme\n    count: {resource: acme.example/vgpu}\n")
    pod = "kind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - name: m\n    resources: {limits: {acme.example/vgpu: 2}}\n"
    code, lines, _ = run_cli(["--rules", str(rules)], capsys, stdin=pod)
    assert code == 0 and lines[0]["request"] == {
        "gpus": 2, "core_percent": 100, "memory_bytes": None, "memory_ratio_percent": 100, "whole": True, "source": "acme"}
    rules.write_text("version: 1\nrules:\n  - name: acme\n    count: {resource: acme}\n")
    code, lines, err = run_cli(["--rules", str(rules)], capsys, stdin=pod)
    assert (code, lines) == (2, [])
    assert "rules[0] (acme): count: resource: 'acme' is not an extended resource name" in err


def test_the_console_command_reads_stdin_in_a_real_process() -> None:
    manifest = (EXAMPLES / "valid" / "hami-share.yaml").read_text() + "---\n" + (EXAMPLES / "invalid" / "negative.yaml").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "fgpuctl.main", "validate", "-f", "-"], input=manifest, capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert done.returncode == 1, done.stderr
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["pod"] == "ml/hami-share" and first["valid"] is True
    assert second["pod"] == "ml/negative" and second["valid"] is False
