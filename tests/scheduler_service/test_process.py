"""fgpu-scheduler as a real process: it serves, and stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from apis import grpc_server
from apis.devices import to_proto
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.scheduler_service.builders import gpu_node


def test_the_daemon_serves_on_its_socket_keeps_state_and_exits_0_on_sigterm(tmp_path: Path, key_file: str) -> None:
    socket = tmp_path / "sched.sock"
    args = [sys.executable, "-m", "scheduler_plugin.main", "--state", "embedded", "--db", str(tmp_path / "s.db"),
            "--grpc-listen", f"unix://{socket}", "--signing-key", key_file]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not socket.exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        client = scheduler_pb2_grpc.SchedulerStub(grpc_server.insecure_channel(f"unix://{socket}"))  # type: ignore[no-untyped-call]
        client.ReportDevices(scheduler_pb2.ReportDevicesRequest(report=to_proto(gpu_node("n1", gpus=1))), timeout=10)
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=20)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, first.stdout.read() if first.stdout else ""

    second = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not socket.exists() and time.monotonic() < deadline and second.poll() is None:
            time.sleep(0.05)
        client = scheduler_pb2_grpc.SchedulerStub(grpc_server.insecure_channel(f"unix://{socket}"))  # type: ignore[no-untyped-call]
        state = client.GetNodeState(scheduler_pb2.GetNodeStateRequest(), timeout=10)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=20)
    assert [n.node_name for n in state.nodes] == ["n1"]
    assert second.returncode == 0
