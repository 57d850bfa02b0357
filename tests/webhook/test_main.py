"""`fgpu-webhook` as a real process: flags, HTTPS, translation rules reloaded, SIGTERM."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apis import names
from tests.webhook.client import Client
from tests.webhook.pki import SecretVolume, issue, make_ca
from tests.webhook.reviews import pod, review

#: the repository: `python -m webhook.main` runs from here, installed or not
ROOT = Path(__file__).resolve().parents[2]


def launch(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "webhook.main", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=ROOT,
    )


def wait_for_port(process: subprocess.Popen[str]) -> tuple[int, list[str]]:
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"serving AdmissionReview v1 on https://127\.0\.0\.1:(\d+)", line)
        if found:
            return int(found.group(1)), lines
    raise AssertionError("".join(lines))


def test_the_command_serves_https_reloads_rules_and_stops_on_sigterm(tmp_path: Path) -> None:
    ca = make_ca()
    volume = SecretVolume(tmp_path / "certs")
    volume.write(issue(ca))
    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nrules:\n  - name: acme\n    count: {resource: acme.example/vgpu}\n")
    config = tmp_path / "webhook.yaml"
    config.write_text(f"translationRules: {rules}\nschedulerInjection: {{excludeNamespaces: [kube-system]}}\n")
    process = launch("--listen", "127.0.0.1:0", "--tls-cert-file", str(volume.cert_file),
                     "--tls-private-key-file", str(volume.key_file), "--config", str(config))
    try:
        port, _ = wait_for_port(process)
        client = Client(port, ca.pem)
        acme = pod(resources={"acme.example/vgpu": 1})
        assert "patch" in client.post("/mutate", review(acme))["response"]
        assert "patch" not in client.post("/mutate", review(pod(resources={names.NVIDIA_GPU: 1})))["response"]
        assert "patch" not in client.post("/mutate", review(pod(resources={"acme.example/vgpu": 1},
                                                                namespace="kube-system")))["response"]
        # The rules file changes (a ConfigMap update): nvidia.com/gpu is a GPU now, acme's is not.
        rules.write_text("version: 1\nrules:\n  - name: nvidia\n    count: {resource: nvidia.com/gpu}\n")
        deadline = time.monotonic() + 10
        while "patch" not in client.post("/mutate", review(pod(resources={names.NVIDIA_GPU: 1})))["response"]:
            assert time.monotonic() < deadline, "the rules were not reloaded"
            time.sleep(0.2)
        client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 0, output
    assert "stopping" in output and "stopped" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-cert-file", "/nonexistent.crt", "--tls-private-key-file", "/nonexistent.key"],
         "cannot read --tls-cert-file '/nonexistent.crt'"),
        (["--listen", "nowhere", "--tls-cert-file", "a", "--tls-private-key-file", "b"], "--listen='nowhere': expected HOST:PORT"),
        (["--config", "/nonexistent.yaml", "--tls-cert-file", "a", "--tls-private-key-file", "b"],
         "--config /nonexistent.yaml: cannot read it"),
    ],
)
def test_unusable_flags_exit_2_naming_the_flag(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "webhook.main", *args], capture_output=True, text=True, timeout=60,
                          check=False, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_a_port_in_use_exits_2(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path)
    volume.write(issue(make_ca()))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "webhook.main", "--listen", f"127.0.0.1:{port}", "--tls-cert-file",
             str(volume.cert_file), "--tls-private-key-file", str(volume.key_file)],
            capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
        )
    assert done.returncode == 2 and "is the port in use?" in done.stderr
