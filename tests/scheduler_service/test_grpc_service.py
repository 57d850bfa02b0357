"""The gRPC Scheduler service on a unix socket, through generated stubs and the real grpcurl.

With the embedded backend the scheduler's SQLite file is the record of bound
pods, so the signed annotations are read from there (`stored_annotations`), as
kubelet reads them from the API server: no answer carries them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from apis import grpc_server, names
from apis.allocation import decode_allocation
from apis.devices import to_proto
from apis.fgpu.v1 import scheduler_pb2, scheduler_pb2_grpc
from apis.signing import verify_pod_annotations
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.config import SchedulerConfig, StateBackend
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import GiB, gpu_node, share_pod
from tests.scheduler_service.conftest import KEY

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")


@pytest.fixture
def server(tmp_path: Path, key_file: str) -> Iterator[tuple[SchedulerApp, str]]:
    socket = tmp_path / "sched.sock"
    config = SchedulerConfig(
        state=StateBackend.EMBEDDED, db=str(tmp_path / "state.db"), grpc_listen=f"unix://{socket}", signing_key=key_file
    )
    app = SchedulerApp(config, timing=cluster.FAST)
    app.start()
    yield app, str(socket)
    app.stop(1.0)


def stub(socket: str) -> scheduler_pb2_grpc.SchedulerStub:
    return scheduler_pb2_grpc.SchedulerStub(grpc_server.insecure_channel(f"unix://{socket}"))  # type: ignore[no-untyped-call]


def stored_annotations(app: SchedulerApp, name: str, namespace: str = "default") -> dict[str, str]:
    """The annotations of the pod as the scheduler recorded it at bind."""
    assert app.service is not None
    stored = app.service.get_pod(namespace=namespace, name=name)
    assert stored is not None, f"pod {namespace}/{name} is not recorded as bound"
    return dict(stored["metadata"].get("annotations") or {})


def pod_message(name: str, *, core: str = "50", memory: str = "10Gi", uid: str = "") -> scheduler_pb2.Pod:
    return scheduler_pb2.Pod(
        namespace="default",
        name=name,
        uid=uid or f"uid-{name}",
        containers=[scheduler_pb2.Container(name="c", requests={names.GPU_CORE: core, names.GPU_MEMORY: memory})],
    )


def test_report_filter_bind_and_node_state_over_the_socket(server: tuple[SchedulerApp, str]) -> None:
    app, socket = server
    client = stub(socket)
    client.ReportDevices(scheduler_pb2.ReportDevicesRequest(report=to_proto(gpu_node("n1", gpus=2))))
    client.ReportDevices(scheduler_pb2.ReportDevicesRequest(report=to_proto(gpu_node("n2", gpus=1, unhealthy=(0,)))))

    verdicts = client.Filter(scheduler_pb2.FilterRequest(pod=pod_message("p"), node_names=["n1", "n2"])).verdicts
    bound = client.Bind(scheduler_pb2.BindRequest(pod=pod_message("p"), node_name="n1")).allocation
    state = client.GetNodeState(scheduler_pb2.GetNodeStateRequest(node_names=["n1"]))

    assert [(v.node_name, v.feasible) for v in verdicts] == [("n1", True), ("n2", False)]
    assert "healthy" in verdicts[1].reason
    assert [g.core_percent for g in bound.gpus] == [50]
    written = verify_pod_annotations(
        KEY.verifying_keys(), pod_uid="uid-p", node_name="n1", annotations=stored_annotations(app, "p")
    )
    assert written is not None and [g.core_percent for g in written.gpus] == [50]
    gpus = state.nodes[0].gpus
    assert sorted(g.allocated_core_percent for g in gpus) == [0, 50]
    assert [p.name for g in gpus for p in g.pods] == ["p"]
    assert sum(g.allocated_memory_bytes for g in gpus) == 10 * GiB


def test_a_pod_manifest_is_the_source_of_truth_when_sent(server: tuple[SchedulerApp, str]) -> None:
    _, socket = server
    client = stub(socket)
    client.ReportDevices(scheduler_pb2.ReportDevicesRequest(report=to_proto(gpu_node("n1", gpus=1))))
    manifest = share_pod("m", core=100, memory="80Gi")

    reserved = client.Reserve(
        scheduler_pb2.ReserveRequest(pod=scheduler_pb2.Pod(manifest_json=json.dumps(manifest)), node_name="n1")
    ).allocation

    assert [g.core_percent for g in reserved.gpus] == [100]
    with pytest.raises(grpc.RpcError) as caught:
        client.Reserve(scheduler_pb2.ReserveRequest(pod=pod_message("other"), node_name="n1"))
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    client.Unreserve(scheduler_pb2.UnreserveRequest(pod=scheduler_pb2.Pod(manifest_json=json.dumps(manifest))))
    client.Reserve(scheduler_pb2.ReserveRequest(pod=pod_message("other"), node_name="n1"))


def test_bad_input_gets_invalid_argument_naming_the_field(server: tuple[SchedulerApp, str]) -> None:
    _, socket = server
    client = stub(socket)

    with pytest.raises(grpc.RpcError) as bad_json:
        client.Filter(scheduler_pb2.FilterRequest(pod=scheduler_pb2.Pod(manifest_json="{nope")))
    with pytest.raises(grpc.RpcError) as no_node:
        client.Bind(scheduler_pb2.BindRequest(pod=pod_message("p")))
    bad_core = client.Filter(scheduler_pb2.FilterRequest(pod=pod_message("p", core="250"), node_names=["n1"]))

    assert bad_json.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "manifest_json" in (bad_json.value.details() or "")
    assert no_node.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "node_name" in (no_node.value.details() or "")
    assert "250" in bad_core.pod_error and not bad_core.verdicts[0].feasible


def test_grpcurl_lists_the_service_and_runs_a_filter_by_hand(server: tuple[SchedulerApp, str]) -> None:
    _, socket = server
    stub(socket).ReportDevices(scheduler_pb2.ReportDevicesRequest(report=to_proto(gpu_node("n1", gpus=1))))

    listed = subprocess.run([GRPCURL, "-plaintext", "-unix", socket, "list"], capture_output=True, text=True, timeout=30, check=True)
    body = json.dumps({"pod": {"name": "p", "uid": "u1", "containers": [{"name": "c", "requests": {names.GPU_CORE: "30", names.GPU_MEMORY_RATIO: "30"}}]}})
    filtered = subprocess.run(
        [GRPCURL, "-plaintext", "-unix", "-d", body, socket, "fgpu.v1.Scheduler/Filter"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    health = subprocess.run(
        [GRPCURL, "-plaintext", "-unix", "-d", '{"service":"fgpu.v1.Scheduler"}', socket, "grpc.health.v1.Health/Check"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )

    assert {"fgpu.v1.Scheduler", "grpc.health.v1.Health"} <= set(listed.stdout.split())
    assert json.loads(filtered.stdout) == {"verdicts": [{"node_name": "n1", "feasible": True}]}
    assert json.loads(health.stdout) == {"status": "SERVING"}


def test_reserve_and_bind_answers_name_the_gpus_but_carry_no_signature(server: tuple[SchedulerApp, str]) -> None:
    # A signature in an answer could be pasted onto any pod by whoever asked; it lives only on the pod.
    app, socket = server
    client = stub(socket)
    client.ReportDevices(scheduler_pb2.ReportDevicesRequest(report=to_proto(gpu_node("n1", gpus=1))))

    reserved = client.Reserve(scheduler_pb2.ReserveRequest(pod=pod_message("p"), node_name="n1"))
    bound = client.Bind(scheduler_pb2.BindRequest(pod=pod_message("p"), node_name="n1"))

    written = stored_annotations(app, "p")
    secrets = [written[names.ALLOCATION_SIGNATURE], written[names.DEVICE_ALLOCATED]]
    for answer in (reserved, bound):
        assert [(g.uuid, g.core_percent) for g in answer.allocation.gpus] == [("GPU-n1-00", 50)]
        wire = answer.SerializeToString()
        assert not any(secret.encode() in wire for secret in secrets)
    assert set(scheduler_pb2.NodeAllocation.DESCRIPTOR.fields_by_name) == {"node_name", "gpus"}


@pytest.fixture
def kube_server(kube_api: KubeAPIServer, key_file: str, tmp_path: Path) -> Iterator[tuple[SchedulerApp, str]]:
    """The scheduler with the kubernetes backend (the API double), gRPC on a unix socket."""
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    socket = tmp_path / "sched.sock"
    app = cluster.start(cluster.config(kube_api, key_file, grpc_listen=f"unix://{socket}"))
    yield app, str(socket)
    app.stop(1.0)


def test_report_devices_is_refused_with_the_kubernetes_backend(kube_server: tuple[SchedulerApp, str]) -> None:
    # There a node's GPUs come only from its Device object, which only its own agent may write.
    app, socket = kube_server

    with pytest.raises(grpc.RpcError) as caught:
        stub(socket).ReportDevices(scheduler_pb2.ReportDevicesRequest(report=to_proto(gpu_node("n1", gpus=8))))

    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "Device object" in (caught.value.details() or "")
    assert app.service is not None
    assert [len(v.gpus) for v in app.service.node_views(["n1"])] == [1]


def test_bind_with_the_kubernetes_backend_signs_the_pod_as_the_api_has_it_not_as_sent(
    kube_server: tuple[SchedulerApp, str], kube_api: KubeAPIServer
) -> None:
    _, socket = kube_server
    real = cluster.add_pod(kube_api, share_pod("p", core=10, memory="4Gi"))
    forged = share_pod("p", core=100, memory="80Gi", uid=real["metadata"]["uid"])

    bound = stub(socket).Bind(
        scheduler_pb2.BindRequest(pod=scheduler_pb2.Pod(manifest_json=json.dumps(forged)), node_name="n1")
    ).allocation

    assert [g.core_percent for g in bound.gpus] == [10]
    stored = cluster.get_pod(kube_api, "p")
    assert stored["spec"]["nodeName"] == "n1"
    (gpu,) = decode_allocation(stored["metadata"]["annotations"][names.DEVICE_ALLOCATED]).gpus
    assert gpu.core_percent == 10


@pytest.mark.parametrize("rpc", ["Reserve", "Bind"])
def test_reserve_or_bind_with_the_kubernetes_backend_of_a_pod_the_api_lacks_is_not_found(
    kube_server: tuple[SchedulerApp, str], kube_api: KubeAPIServer, rpc: str
) -> None:
    _, socket = kube_server
    real = cluster.add_pod(kube_api, share_pod("p", core=10, memory="4Gi"))
    request = {"Reserve": scheduler_pb2.ReserveRequest, "Bind": scheduler_pb2.BindRequest}[rpc]
    call = getattr(stub(socket), rpc)

    with pytest.raises(grpc.RpcError) as invented:
        call(request(pod=pod_message("invented"), node_name="n1"))
    with pytest.raises(grpc.RpcError) as other_uid:
        call(request(pod=pod_message("p", uid="not-" + real["metadata"]["uid"]), node_name="n1"))

    assert invented.value.code() is grpc.StatusCode.NOT_FOUND and "default/invented" in (invented.value.details() or "")
    assert other_uid.value.code() is grpc.StatusCode.NOT_FOUND and "recreated" in (other_uid.value.details() or "")
