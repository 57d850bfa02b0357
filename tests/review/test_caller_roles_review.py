"""Who may call the scheduler's authenticated verbs: one caller-role rule for gRPC and the extender.

A certificate is a node's identity when one of its names is `system:node:<node>` (kubelet's
convention) or is the name of a node the scheduler knows. A node's identity reports its own GPUs and
reads; it never reserves, binds or unreserves over gRPC, and never calls the extender's verbs (those
are kube-scheduler's). Everything here runs against one embedded-state scheduler with gRPC and the
extender on every interface under mutual TLS, with certificates made per test by a throwaway CA.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from apis import tls
from apis.devices import to_proto
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_plugin import config as config_mod
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.config import SchedulerConfig, StateBackend
from tests.review.test_heldout_ports_review import _CA, _issue, _make_ca
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, pod
from tests.signing_keys import signing_key, write_signing_key

SHARE = {"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}


@dataclass(frozen=True)
class Scheduler:
    app: SchedulerApp
    ca: _CA
    directory: Path

    def client(self, common_name: str, *, dns: tuple[str, ...] = ()) -> tls.TLSFiles:
        return _issue(self.ca, self.directory, common_name=common_name, dns=dns)

    def grpc(self, files: tls.TLSFiles) -> tuple[grpc.Channel, Any]:
        assert self.app.grpc is not None
        channel = tls.grpc_channel(f"localhost:{self.app.grpc.port}", files, field="test")
        return channel, scheduler_pb2_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]

    def extender(self, files: tls.TLSFiles, verb: str, body: dict[str, Any]) -> tuple[int, bytes]:
        assert self.app.extender is not None
        context = ssl.create_default_context(cafile=files.ca_file)
        context.load_cert_chain(files.cert_file, files.key_file)
        connection = http.client.HTTPSConnection("localhost", self.app.extender.port, context=context, timeout=5)
        try:
            connection.request("POST", f"/scheduler/{verb}", body=json.dumps(body), headers={"Content-Type": "application/json"})
            answer = connection.getresponse()
            return answer.status, answer.read()
        finally:
            connection.close()


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    directory = Path(tmp_path_factory.mktemp("roles"))
    ca = _make_ca(directory)
    server = _issue(ca, directory, common_name="fgpu-scheduler", server=True)
    config = SchedulerConfig(
        state=StateBackend.EMBEDDED,
        db=str(directory / "state.db"),
        signing_key=write_signing_key(str(directory / "signing-key"), signing_key("roles-review")),
        grpc_listen="0.0.0.0:0",
        grpc_tls=server,
        extender_listen="0.0.0.0:0",
        extender_tls=server,
    )
    config_mod.validate(config)
    app = SchedulerApp(config, timing=cluster.FAST)
    app.start()
    try:
        yield Scheduler(app=app, ca=ca, directory=directory)
    finally:
        app.stop(1.0)


def _report(scheduler: Scheduler, files: tls.TLSFiles, node: str) -> None:
    channel, stub = scheduler.grpc(files)
    try:
        stub.ReportDevices(scheduler_pb2.ReportDevicesRequest(report=to_proto(gpu_node(node, gpus=1))), timeout=5)
    finally:
        channel.close()


def _pods_on(scheduler: Scheduler, node: str) -> list[str]:
    channel, stub = scheduler.grpc(scheduler.client("fgpu-operator"))
    try:
        nodes = stub.GetNodeState(scheduler_pb2.GetNodeStateRequest(node_names=[node]), timeout=5).nodes
    finally:
        channel.close()
    return [p.name for n in nodes for g in n.gpus for p in g.pods]


def _grpc_call(stub: Any, verb: str, *, name: str, node: str) -> Any:
    message = scheduler_pb2.Pod(
        namespace="default", name=name, uid=f"uid-{name}",
        containers=[scheduler_pb2.Container(name="c", requests=SHARE)],
    )
    if verb == "Unreserve":
        return stub.Unreserve(scheduler_pb2.UnreserveRequest(pod=message), timeout=5)
    return getattr(stub, verb)(getattr(scheduler_pb2, f"{verb}Request")(pod=message, node_name=node), timeout=5)


# --- gRPC: a bare node name is a node too -------------------------------------------------------------


@pytest.mark.parametrize("verb", ["Reserve", "Bind", "Unreserve"])
def test_a_certificate_named_for_a_known_node_without_the_prefix_cannot_reserve_or_bind(
    scheduler: Scheduler, verb: str
) -> None:
    """An agent's certificate with CN=<node> is accepted for that node's reports; it must not then
    mint signed allocations of any pod on any node (the embedded backend signs the pod sent)."""
    node = f"bare-{verb.lower()}"
    files = scheduler.client(node)
    _report(scheduler, files, node)
    channel, stub = scheduler.grpc(files)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            _grpc_call(stub, verb, name=f"minted-{verb.lower()}", node=node)
    finally:
        channel.close()
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    details = str(caught.value.details())
    assert f"'{node}'" in details and "names no node" in details, details
    assert _pods_on(scheduler, node) == []


def test_a_certificate_whose_dns_name_is_a_known_node_cannot_bind(scheduler: Scheduler) -> None:
    node = "dns-named"
    files = scheduler.client("fgpu-agent", dns=(node,))
    _report(scheduler, files, node)
    channel, stub = scheduler.grpc(files)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            _grpc_call(stub, "Bind", name="minted-dns", node=node)
    finally:
        channel.close()
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "'fgpu-agent'" in str(caught.value.details()) and f"'{node}'" in str(caught.value.details())


def test_a_certificate_that_names_no_node_still_reserves_and_binds(scheduler: Scheduler) -> None:
    node = "operated"
    _report(scheduler, scheduler.client(f"system:node:{node}"), node)
    channel, stub = scheduler.grpc(scheduler.client("fgpu-operator"))
    try:
        _grpc_call(stub, "Reserve", name="by-operator", node=node)
        bound = _grpc_call(stub, "Bind", name="by-operator", node=node)
    finally:
        channel.close()
    assert bound.allocation.node_name == node
    assert _pods_on(scheduler, node) == ["by-operator"]


def test_a_bare_named_node_still_reads_the_state(scheduler: Scheduler) -> None:
    node = "bare-reader"
    files = scheduler.client(node)
    _report(scheduler, files, node)
    channel, stub = scheduler.grpc(files)
    try:
        nodes = stub.GetNodeState(scheduler_pb2.GetNodeStateRequest(node_names=[node]), timeout=5).nodes
        scored = stub.Score(scheduler_pb2.ScoreRequest(pod=scheduler_pb2.Pod(name="p", uid="u"), node_names=[node]), timeout=5)
    finally:
        channel.close()
    assert [n.node_name for n in nodes] == [node] and [s.node_name for s in scored.scores] == [node]


# --- the extender: kube-scheduler's, not a node's -----------------------------------------------------


def _filter_args(name: str, node: str) -> dict[str, Any]:
    return {"Pod": pod(name, uid=f"uid-{name}", requests=SHARE), "NodeNames": [node]}


def _bind_args(name: str, node: str) -> dict[str, Any]:
    return {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": node}


@pytest.mark.parametrize("common_name", ["system:node:{node}", "{node}"])
@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
def test_a_nodes_certificate_is_refused_the_extenders_verbs_with_a_403_that_names_it(
    scheduler: Scheduler, common_name: str, verb: str
) -> None:
    node = f"ext-{verb}-{'prefixed' if common_name.startswith('system') else 'bare'}"
    files = scheduler.client(common_name.format(node=node))
    _report(scheduler, files, node)
    name = f"ext-minted-{node}"
    scheduler.extender(scheduler.client("system:kube-scheduler"), "filter", _filter_args(name, node))

    status, body = scheduler.extender(files, verb, _bind_args(name, node) if verb == "bind" else _filter_args(name, node))

    assert status == 403, body
    message = body.decode()
    assert repr(common_name.format(node=node)) in message and "kube-scheduler" in message, message
    assert _pods_on(scheduler, node) == []


def test_kube_schedulers_certificate_filters_and_binds_through_the_extender(scheduler: Scheduler) -> None:
    node = "ext-kube-scheduler"
    _report(scheduler, scheduler.client(f"system:node:{node}"), node)
    kube_scheduler = scheduler.client("system:kube-scheduler")

    status, body = scheduler.extender(kube_scheduler, "filter", _filter_args("placed", node))
    assert status == 200 and json.loads(body)["NodeNames"] == [node], body
    status, body = scheduler.extender(kube_scheduler, "bind", _bind_args("placed", node))

    assert status == 200 and json.loads(body) == {"Error": ""}, body
    assert _pods_on(scheduler, node) == ["placed"]


def test_a_nodes_certificate_still_gets_the_extenders_probes(scheduler: Scheduler) -> None:
    assert scheduler.app.extender is not None
    files = scheduler.client("system:node:prober")
    context = ssl.create_default_context(cafile=files.ca_file)
    context.load_cert_chain(files.cert_file, files.key_file)
    connection = http.client.HTTPSConnection("localhost", scheduler.app.extender.port, context=context, timeout=5)
    try:
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        assert (answer.status, answer.read()) == (200, b"ok")
    finally:
        connection.close()
