"""grpcurl against a socket whose health reports on services it does not serve (the runtime proxy's admin socket).

Reflection must list only what the socket serves, or an operator's next
command after `list`, `describe`, fails on a name it cannot resolve; health
still answers for the reported names.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2

from apis import names
from apis.fgpu.v1 import scheduler_pb2_grpc
from apis.grpc_server import add_health_and_reflection, add_listener
from runtimeproxy.config import ProxyConfig
from runtimeproxy.server import ProxyThread
from tests.grpcurl.test_grpcurl_lists_services import SCHEDULER, grpcurl, grpcurl_binary

HEALTH = "grpc.health.v1.Health"
REPORTED = ("example.v1.Backend", names.CRI_RUNTIME_SERVICE)


def health_of(socket: str, service: str) -> str:
    answer: str = json.loads(grpcurl(socket, f"{HEALTH}/Check", flags=("-d", json.dumps({"service": service}))))["status"]
    return answer


@pytest.fixture
def directory() -> Iterator[str]:
    # pytest's tmp_path can exceed the 107-byte limit of a unix socket path.
    path = tempfile.mkdtemp(prefix="fgpu-grpcurl-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def reporting_server(directory: str) -> Iterator[tuple[str, health.HealthServicer]]:
    socket_path = str(Path(directory) / "api.sock")
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler_pb2_grpc.SchedulerServicer(), srv)  # type: ignore[no-untyped-call]
    servicer = add_health_and_reflection(srv, [SCHEDULER], reported=REPORTED)
    add_listener(srv, f"unix://{socket_path}")
    srv.start()
    yield socket_path, servicer
    srv.stop(grace=None)


def test_reflection_lists_served_services_only_and_describe_resolves_every_one(
    reporting_server: tuple[str, health.HealthServicer],
) -> None:
    socket, _ = reporting_server
    listed = set(grpcurl(socket, "list").split())
    assert SCHEDULER in listed and HEALTH in listed
    assert not listed & set(REPORTED)
    described = grpcurl(socket, "describe")  # every listed service; exits 1 on one it cannot resolve
    assert f"{SCHEDULER} is a service" in described


def test_health_answers_for_reported_services_not_serving_until_the_caller_says_otherwise(
    reporting_server: tuple[str, health.HealthServicer],
) -> None:
    socket, servicer = reporting_server
    assert health_of(socket, SCHEDULER) == "SERVING"
    assert health_of(socket, names.CRI_RUNTIME_SERVICE) == "NOT_SERVING"
    servicer.set(names.CRI_RUNTIME_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    assert health_of(socket, names.CRI_RUNTIME_SERVICE) == "SERVING"


def test_a_service_cannot_be_both_served_and_reported() -> None:
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    with pytest.raises(ValueError, match="both served and reported"):
        add_health_and_reflection(srv, [SCHEDULER], reported=[SCHEDULER])


def test_grpcurl_describes_the_runtime_proxys_admin_socket_with_containerd_down(directory: str) -> None:
    hooks = Path(directory) / "hooks.d"
    hooks.mkdir()
    admin = f"{directory}/admin.sock"
    config = ProxyConfig(listen=f"unix://{directory}/proxy.sock", backend=f"unix://{directory}/absent.sock",
                         hook_config_dir=str(hooks), admin_listen=f"unix://{admin}", metrics_listen="",
                         backend_dial_timeout_s=1.0)
    with ProxyThread(config):
        listed = set(grpcurl(admin, "list").split())
        assert HEALTH in listed and names.CRI_RUNTIME_SERVICE not in listed and names.CRI_IMAGE_SERVICE not in listed
        described = subprocess.run([grpcurl_binary(), "-plaintext", "-unix", admin, "describe"],
                                   capture_output=True, text=True, timeout=30, check=False)
        assert described.returncode == 0, described.stderr
        for service in (names.CRI_RUNTIME_SERVICE, names.CRI_IMAGE_SERVICE):
            assert health_of(admin, service) == "NOT_SERVING"
