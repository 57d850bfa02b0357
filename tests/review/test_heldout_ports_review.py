"""Held-out review of what a pod author can do over the network to each fgpu listener.

The default install (deploy/chart) puts on the pod network: the agents' `/metrics` (hostNetwork,
`<node IP>:9400`), the scheduler's `/metrics` + probes (`:9445`, the only port its NetworkPolicy
admits), the descheduler's `/metrics` (`:9403`) and the webhook's HTTPS. The scheduler's gRPC and
extender listen on loopback of its Pod; beyond loopback they take mutual TLS only (`grpcTLS`,
`extenderTLS`). Each test here is an attack with nothing but a socket against the real server; the
ones written failing (strict xfail) had their markers removed with the fixes.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from apis import tls
from apis.devices import to_proto
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_plugin import config as config_mod
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.config import SchedulerConfig, StateBackend
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node
from tests.signing_keys import signing_key, write_signing_key

# --- a throwaway PKI whose client certificates name whom we choose -------------------------------


@dataclass(frozen=True)
class _CA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _make_ca(directory: Path) -> _CA:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ports review CA")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5)).not_valid_after(_now() + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / "ca.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return _CA(key=key, cert=cert, path=path)


def _issue(ca: _CA, directory: Path, *, common_name: str, dns: tuple[str, ...] = (), server: bool = False) -> tls.TLSFiles:
    """A certificate `ca` signed, as TLSFiles for the end that holds it (its CA file: `ca`)."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5)).not_valid_after(_now() + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    )
    alt: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    if server:
        alt += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    stem = directory / common_name.replace(":", "_")
    stem.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    stem.with_suffix(".key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return tls.TLSFiles(cert_file=str(stem.with_suffix(".crt")), key_file=str(stem.with_suffix(".key")), ca_file=str(ca.path))


@dataclass(frozen=True)
class Scheduler:
    app: SchedulerApp
    ca: _CA
    directory: Path

    @property
    def grpc_address(self) -> str:
        assert self.app.grpc is not None
        return f"localhost:{self.app.grpc.port}"

    @property
    def metrics_port(self) -> int:
        assert self.app.probes is not None
        return int(self.app.probes.port)

    def client(self, common_name: str, *, dns: tuple[str, ...] = ()) -> tls.TLSFiles:
        return _issue(self.ca, self.directory, common_name=common_name, dns=dns)


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    """An embedded-state scheduler as docs/scheduler.md shows it beyond loopback: gRPC on every interface
    with mutual TLS (agents report over it), and the metrics listener on every interface."""
    directory = Path(tmp_path_factory.mktemp("ports"))
    ca = _make_ca(directory)
    server = _issue(ca, directory, common_name="fgpu-scheduler", server=True)
    config = SchedulerConfig(
        state=StateBackend.EMBEDDED,
        db=str(directory / "state.db"),
        signing_key=write_signing_key(str(directory / "signing-key"), signing_key("ports-review")),
        grpc_listen="0.0.0.0:0",
        grpc_tls=server,
        metrics_listen="0.0.0.0:0",
    )
    config_mod.validate(config)
    app = SchedulerApp(config, timing=cluster.FAST)
    app.start()
    try:
        yield Scheduler(app=app, ca=ca, directory=directory)
    finally:
        app.stop(1.0)


def _stub(scheduler: Scheduler, files: tls.TLSFiles) -> tuple[grpc.Channel, Any]:
    channel = tls.grpc_channel(scheduler.grpc_address, files, field="test")
    return channel, scheduler_pb2_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]


def _report(stub: Any, node: str, *, gpus: int = 2) -> None:
    stub.ReportDevices(scheduler_pb2.ReportDevicesRequest(report=to_proto(gpu_node(node, gpus=gpus))), timeout=5)


def _gpus_of(stub: Any, node: str) -> int:
    nodes = stub.GetNodeState(scheduler_pb2.GetNodeStateRequest(node_names=[node]), timeout=5).nodes
    return sum(len(n.gpus) for n in nodes if n.node_name == node)


# --- defects ---------------------------------------------------------------------------------------


def test_a_nodes_certificate_cannot_report_the_gpus_of_another_node(scheduler: Scheduler) -> None:
    """docs/scheduler.md has agents report over `grpcTLS` with their own certificates. Whoever holds one
    node's key (root in a pod that escaped onto that node, or its agent's Secret) must not be able to say
    that another node has free GPUs, or that a busy one has none: the scheduler would place pods on GPUs
    that do not exist, or drop the allocations of the real ones as orphans."""
    channel, victim = _stub(scheduler, scheduler.client("system:node:victim"))
    try:
        _report(victim, "victim", gpus=2)
        assert _gpus_of(victim, "victim") == 2
    finally:
        channel.close()

    channel, attacker = _stub(scheduler, scheduler.client("system:node:attacker"))
    try:
        with pytest.raises(grpc.RpcError) as caught:
            _report(attacker, "victim", gpus=8)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "victim" in str(caught.value.details()) and "attacker" in str(caught.value.details())
        assert _gpus_of(attacker, "victim") == 2, "the forged report replaced the victim node's GPUs"
    finally:
        channel.close()



@pytest.mark.parametrize("verb", ["Reserve", "Bind", "Unreserve"])
def test_a_nodes_certificate_cannot_reserve_or_bind(scheduler: Scheduler, verb: str) -> None:
    """A node's certificate (kubelet's convention, CN system:node:<node>) is for reporting that node. With
    the embedded backend Reserve and Bind sign the pod the caller sends: a node's key would mint signed
    allocations of any GPUs, on any node, for any pod, and Unreserve would free other pods' GPUs."""
    node = f"minter-{verb.lower()}"
    channel, stub = _stub(scheduler, scheduler.client(f"system:node:{node}"))
    try:
        _report(stub, node, gpus=1)
        pod = scheduler_pb2.Pod(
            namespace="default", name=f"forged-{verb.lower()}", uid=f"uid-{verb.lower()}",
            containers=[scheduler_pb2.Container(name="c", requests={"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"})],
        )
        with pytest.raises(grpc.RpcError) as caught:
            if verb == "Unreserve":
                stub.Unreserve(scheduler_pb2.UnreserveRequest(pod=pod), timeout=5)
            else:
                request = getattr(scheduler_pb2, f"{verb}Request")(pod=pod, node_name=node)
                getattr(stub, verb)(request, timeout=5)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert f"system:node:{node}" in str(caught.value.details())
        assert all(not g.pods for n in stub.GetNodeState(scheduler_pb2.GetNodeStateRequest(), timeout=5).nodes for g in n.gpus)
    finally:
        channel.close()

# --- promises that held ----------------------------------------------------------------------------


def test_a_node_reports_its_own_gpus_with_its_name_as_common_name_or_dns_name(scheduler: Scheduler) -> None:
    for node, files in (
        ("own-cn", scheduler.client("system:node:own-cn")),
        ("own-bare", scheduler.client("own-bare")),
        ("own-dns", scheduler.client("fgpu-agent", dns=("own-dns",))),
    ):
        channel, stub = _stub(scheduler, files)
        try:
            _report(stub, node, gpus=1)
            assert _gpus_of(stub, node) == 1
        finally:
            channel.close()


def test_a_certificate_that_names_no_node_gets_a_refusal_that_says_which_name_to_give(scheduler: Scheduler) -> None:
    channel, stub = _stub(scheduler, scheduler.client("fgpu-operator"))
    try:
        with pytest.raises(grpc.RpcError) as caught:
            _report(stub, "some-node")
    finally:
        channel.close()
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    details = str(caught.value.details())
    assert "'fgpu-operator'" in details and "system:node:some-node" in details


def test_connections_that_never_start_tls_do_not_keep_an_agent_from_reporting(scheduler: Scheduler) -> None:
    """The mutual-TLS gRPC port beyond loopback is reachable by any pod, certificate or not."""
    port = int(scheduler.grpc_address.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(300)]
    try:
        # and a stranger that sends a ClientHello's worth of garbage
        held[0].sendall(b"\x16\x03\x01\x02\x00" + b"\x00" * 64)
        channel, stub = _stub(scheduler, scheduler.client("system:node:flooded"))
        try:
            started = time.monotonic()
            _report(stub, "flooded", gpus=1)
            assert time.monotonic() - started < 5
        finally:
            channel.close()
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/bind", b'{"PodName":"p","PodNamespace":"default","PodUID":"u","Node":"victim"}'),
        ("/scheduler/filter", b'{"Pod":{"metadata":{"name":"p","uid":"u"}},"NodeNames":["victim"]}'),
        ("/prioritize", b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":["victim"]}'),
    ],
)
def test_the_metrics_port_on_the_pod_network_takes_no_extender_verb(scheduler: Scheduler, path: str, body: bytes) -> None:
    """`metricsListen: 0.0.0.0:9445` is what the chart's NetworkPolicy admits from every namespace; a
    forged extender call there must not bind, filter or reserve."""
    connection = http.client.HTTPConnection("127.0.0.1", scheduler.metrics_port, timeout=5)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        assert answer.status == 404, answer.read()
    finally:
        connection.close()
    channel, stub = _stub(scheduler, scheduler.client("system:node:victim"))
    try:
        reserved = stub.GetNodeState(scheduler_pb2.GetNodeStateRequest(), timeout=5).nodes
        assert all(not g.pods for n in reserved for g in n.gpus)
    finally:
        channel.close()
