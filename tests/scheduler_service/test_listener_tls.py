"""Who can reach the scheduler: loopback and unix sockets by default, mutual TLS beyond, with real certificates.

A throwaway CA (tests/scheduler_service/certs.py) signs the server's and a
good client's certificate; a second CA signs a stranger's. Each test connects
for real: grpc's own TLS for gRPC, Python's ssl for the extender's HTTPS.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.config import parse_config
from agent.errors import ConfigError as AgentConfigError
from agent.schedclient import SchedulerReporter
from apis import tls
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_plugin import config as config_mod
from scheduler_plugin import main as cli
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.config import ConfigError, SchedulerConfig, StateBackend
from scheduler_plugin.errors import InvalidRequest
from scheduler_plugin.grpc_service import GrpcServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node
from tests.scheduler_service.certs import PKI, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return make_pki(Path(tmp_path_factory.mktemp("pki")))


def embedded(tmp_path: Path, key_file: str, **listeners: Any) -> SchedulerApp:
    """An embedded-state scheduler with only the given listeners (gRPC off unless given)."""
    settings: dict[str, Any] = {"grpc_listen": "", **listeners}
    config = SchedulerConfig(state=StateBackend.EMBEDDED, db=str(tmp_path / "state.db"), signing_key=key_file, **settings)
    config_mod.validate(config)
    app = SchedulerApp(config, timing=cluster.FAST)
    app.start()
    return app


@pytest.fixture
def grpc_tls_app(tmp_path: Path, key_file: str, pki: PKI) -> Iterator[SchedulerApp]:
    # Every interface: allowed because the listener demands client certificates.
    app = embedded(tmp_path, key_file, grpc_listen="0.0.0.0:0", grpc_tls=pki.server_files())
    yield app
    app.stop(1.0)


def grpc_port(app: SchedulerApp) -> int:
    assert app.grpc is not None and app.grpc.port > 0
    return app.grpc.port


def node_state(channel: grpc.Channel) -> scheduler_pb2.GetNodeStateResponse:
    stub = scheduler_pb2_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]
    response: scheduler_pb2.GetNodeStateResponse = stub.GetNodeState(scheduler_pb2.GetNodeStateRequest(), timeout=5)
    return response


# --- configuration: refused before anything starts -------------------------------------------


@pytest.mark.parametrize("address", ["0.0.0.0:9090", ":9090", "[::]:9090", "10.1.2.3:9090", "scheduler.example:9090"])
def test_a_grpc_listener_beyond_loopback_without_tls_is_refused_naming_the_setting_and_the_fix(address: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_mod.from_mapping({"state": "embedded", "grpcListen": address})

    message = str(caught.value)
    assert "grpcListen" in message and repr(address) in message
    assert "grpcTLS" in message and "127.0.0.1" in message and "unix://" in message


@pytest.mark.parametrize("address", ["unix:///run/fgpu/scheduler.sock", "127.0.0.1:9090", "localhost:9090", "[::1]:9090"])
def test_a_unix_socket_or_loopback_grpc_listener_needs_no_tls(address: str) -> None:
    assert config_mod.from_mapping({"grpcListen": address}).grpc_listen == address


def test_grpc_tls_given_in_part_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(ConfigError) as caught:
        config_mod.from_mapping({"grpcListen": "0.0.0.0:9090", "grpcTLS": {"certFile": "/tls/tls.crt"}})

    assert "grpcTLS" in str(caught.value) and "keyFile, clientCAFile missing" in str(caught.value)


@pytest.mark.parametrize("address", ["0.0.0.0:9444", "10.1.2.3:9444"])
def test_an_extender_beyond_loopback_without_tls_is_refused(address: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_mod.from_mapping({"extenderListen": address})

    assert "extenderListen" in str(caught.value) and "extenderTLS" in str(caught.value)


def test_the_daemon_refuses_to_start_a_plaintext_grpc_port_beyond_loopback_with_exit_code_2(
    tmp_path: Path, key_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--state", "embedded", "--db", str(tmp_path / "s.db"), "--grpc-listen", "0.0.0.0:0", "--signing-key", key_file])

    assert code == 2
    assert "--grpc-listen" in capsys.readouterr().err


def test_the_grpc_server_itself_refuses_a_plaintext_port_beyond_loopback(tmp_path: Path, key_file: str) -> None:
    # The config check is not the only guard: no code path opens a plaintext port to the network.
    app = embedded(tmp_path, key_file)
    try:
        assert app.service is not None
        with pytest.raises(InvalidRequest, match="grpcTLS"):
            GrpcServer(app.service, address="0.0.0.0:0", pods_from_api=False, accept_reports=True)
    finally:
        app.stop(1.0)


# --- gRPC over mutual TLS ----------------------------------------------------------------------


def test_a_client_with_a_certificate_from_the_ca_is_served_over_mutual_tls(grpc_tls_app: SchedulerApp, pki: PKI) -> None:
    channel = tls.grpc_channel(f"localhost:{grpc_port(grpc_tls_app)}", pki.client_files(), field="test")
    try:
        assert list(node_state(channel).nodes) == []
    finally:
        channel.close()


def test_a_client_without_a_certificate_is_refused(grpc_tls_app: SchedulerApp, pki: PKI) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
    channel = grpc.secure_channel(f"localhost:{grpc_port(grpc_tls_app)}", credentials)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            node_state(channel)
    finally:
        channel.close()
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_client_whose_certificate_another_ca_signed_is_refused(grpc_tls_app: SchedulerApp, pki: PKI) -> None:
    channel = tls.grpc_channel(f"localhost:{grpc_port(grpc_tls_app)}", pki.client_files(pki.stranger), field="test")
    try:
        with pytest.raises(grpc.RpcError) as caught:
            node_state(channel)
    finally:
        channel.close()
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_plaintext_client_is_refused_by_the_tls_listener(grpc_tls_app: SchedulerApp) -> None:
    channel = grpc.insecure_channel(f"localhost:{grpc_port(grpc_tls_app)}")
    try:
        with pytest.raises(grpc.RpcError) as caught:
            node_state(channel)
    finally:
        channel.close()
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def test_the_agent_reports_its_devices_over_mutual_tls(grpc_tls_app: SchedulerApp, pki: PKI) -> None:
    address = f"localhost:{grpc_port(grpc_tls_app)}"
    reporter = SchedulerReporter(address, tls_files=pki.client_files())
    try:
        # The certificate names the node it reports (CN fgpu-client): a node reports only its own GPUs.
        assert reporter.report(gpu_node("fgpu-client", gpus=2), (), force=True)
    finally:
        reporter.close()

    channel = tls.grpc_channel(address, pki.client_files(), field="test")
    try:
        assert [n.node_name for n in node_state(channel).nodes] == ["fgpu-client"]
    finally:
        channel.close()


def test_the_agent_refuses_plaintext_to_a_scheduler_beyond_loopback() -> None:
    with pytest.raises(AgentConfigError) as caught:
        parse_config({"scheduler": "10.1.2.3:9090"})

    assert "schedulerTLS" in str(caught.value) and "10.1.2.3:9090" in str(caught.value)


def test_the_agent_reads_its_scheduler_tls_files_from_the_config(pki: PKI) -> None:
    files = pki.client_files()
    config = parse_config(
        {
            "scheduler": "scheduler.example:9090",
            "schedulerTLS": {"caFile": files.ca_file, "certFile": files.cert_file, "keyFile": files.key_file},
        }
    )

    assert config.scheduler_tls == files


# --- the extender over HTTPS with client certificates ---------------------------------------------


@pytest.fixture
def https_extender(tmp_path: Path, key_file: str, pki: PKI) -> Iterator[int]:
    app = embedded(tmp_path, key_file, extender_listen="0.0.0.0:0", extender_tls=pki.server_files())
    assert app.extender is not None
    yield app.extender.port
    app.stop(1.0)


def https_get(port: int, path: str, context: ssl.SSLContext) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(
        raw, server_hostname="localhost"
    ) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        return answer


def client_context(pki: PKI, *, cert: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        context.load_cert_chain(str(pki.client.cert), str(pki.client.key))
    return context


def test_the_extender_over_https_serves_a_client_with_a_certificate(https_extender: int, pki: PKI) -> None:
    answer = https_get(https_extender, "/healthz", client_context(pki))

    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok")


def test_the_extender_over_https_refuses_a_client_without_a_certificate(https_extender: int, pki: PKI) -> None:
    try:
        answer = https_get(https_extender, "/healthz", client_context(pki, cert=False))
    except (ssl.SSLError, ConnectionError):
        return  # refused in the handshake (TLS 1.2) or right after it (TLS 1.3)
    assert answer == b""


def test_the_extender_over_https_refuses_plaintext(https_extender: int) -> None:
    with socket.create_connection(("127.0.0.1", https_extender), timeout=5) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = conn.recv(65536)
        except ConnectionError:
            answer = b""
    assert b"200" not in answer
