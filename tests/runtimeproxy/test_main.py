"""`fgpu-runtime-proxy` as a process: sockets, admin health, metrics, signals, bad input."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apis import names
from tests.runtimeproxy.fakeruntime import FakeRuntime
from tests.runtimeproxy.kubelet import Kubelet

ROOT = str(Path(__file__).resolve().parents[2])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stale_socket(path: str) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()


def wait_for(predicate: object, timeout_s: float = 20.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_proxy_process_serves_cri_health_and_metrics_and_stops_on_sigterm(
    tmp_path: Path, fake_runtime: FakeRuntime
) -> None:
    listen = str(tmp_path / "proxy.sock")
    admin = str(tmp_path / "admin.sock")
    stale_socket(listen)
    port = free_port()
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text(
        f"listen: unix://{listen}\nbackend: {fake_runtime.address}\nadminListen: unix://{admin}\n"
        f"metricsListen: 127.0.0.1:{port}\nhookConfigDir: {tmp_path / 'hooks.d'}\nsocketGroup: '{os.getgid()}'\n"
        "logFormat: json\n"
    )
    proc = subprocess.Popen([sys.executable, "-m", "runtimeproxy.main", "--config", str(cfg)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: os.path.exists(admin) and stat.S_IMODE(os.stat(listen).st_mode) == 0o660)
        with Kubelet(f"unix://{listen}") as k:
            got, _ = k.raw("/test.Echo/Unary", b"through the process")
        assert got == b"through the process"
        with grpc.insecure_channel(f"unix://{admin}") as ch:
            health = health_pb2_grpc.HealthStub(ch)  # type: ignore[no-untyped-call]
            status = health.Check(health_pb2.HealthCheckRequest(service=names.CRI_RUNTIME_SERVICE), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'fgpu_runtime_proxy_calls_total{code="OK",method="unknown"} 1.0' in metrics
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert not os.path.exists(listen)
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.communicate()[1]
    assert '"msg": "runtime proxy serving"' in stderr


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "proxy.yaml"
    cfg.write_text("listen: unix://relative\n")
    result = subprocess.run([sys.executable, "-m", "runtimeproxy.main", "--config", str(cfg)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "listen='unix://relative'" in result.stderr
    assert "absolute path" in result.stderr


def test_listen_path_held_by_a_regular_file_is_not_deleted(tmp_path: Path) -> None:
    listen = tmp_path / "proxy.sock"
    listen.write_text("not a socket")
    result = subprocess.run(
        [sys.executable, "-m", "runtimeproxy.main", "--listen", f"unix://{listen}", "--backend", "unix:///nonexistent.sock",
         "--admin-listen", "", "--metrics-listen", ""],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "exists and is not a socket" in result.stderr
    assert "Traceback" not in result.stderr
    assert listen.read_text() == "not a socket"
