"""Device and node reporting through the official client against the Kubernetes API double."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from kubernetes import client, config

from agent.discovery import discover
from agent.errors import KubeAPIError
from agent.kube import JSON, Kube
from agent.metrics import AgentMetrics
from agent.node_report_writer import KubeReporter
from agent.pcitopology import InventoryTopology
from agent.resync_loop import ReportLoop
from apis import names
from apis.devices import ExternalHolder, NodeDevices, from_device_object
from tests.agent.helpers import H100, T4, started_fake
from tests.kubeapi import DEVICE_CRD, KubeAPIServer
from tests.waiting import wait_until as _wait

NODE = "gpu-node-1"
DEVICE_PATH = f"/apis/{names.DEVICE_GROUP}/{names.DEVICE_VERSION}/devices/{NODE}"
NODE_PATH = f"/api/v1/nodes/{NODE}"


@pytest.fixture
def cluster(kube_api: KubeAPIServer) -> KubeAPIServer:
    kube_api.install_crd(DEVICE_CRD)
    kube_api.put_object("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return kube_api


@pytest.fixture
def kube(cluster: KubeAPIServer) -> Iterator[Kube]:
    client = Kube.connect(kubeconfig=cluster.kubeconfig_path, request_timeout_s=2.0)
    yield client
    client.close()


def _devices(path: str = T4) -> NodeDevices:
    nvml, inventory = started_fake(path)
    return discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices



def test_the_device_is_created_owned_by_the_node_and_reads_back_as_the_same_devices(
    cluster: KubeAPIServer, kube: Kube
) -> None:
    devices = _devices(H100)
    KubeReporter(kube, node_name=NODE).report(devices)
    stored = cluster.get_object(DEVICE_PATH)
    node = cluster.get_object(NODE_PATH)
    assert stored is not None and node is not None
    assert stored["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    assert from_device_object(stored) == devices
    assert len(stored["spec"]["devices"]) == 8


def test_node_labels_and_extended_resources_come_from_healthy_gpus(cluster: KubeAPIServer, kube: Kube) -> None:
    devices = _devices(T4)
    sick = replace(devices, gpus=(replace(devices.gpus[0], healthy=False, health_reason="Xid48"), *devices.gpus[1:]))
    KubeReporter(kube, node_name=NODE, advertise_nvidia_gpu=True).report(sick)
    node = cluster.get_object(NODE_PATH)
    assert node is not None
    assert node["metadata"]["labels"][names.NODE_GPU_MODEL] == "T4"
    assert node["metadata"]["labels"][names.NODE_GPU_DRIVER_VERSION] == "535.161.08"
    for section in ("capacity", "allocatable"):
        assert node["status"][section][names.GPU_CORE] == "300"
        assert node["status"][section][names.GPU_MEMORY] == "45Gi"
        assert node["status"][section][names.GPU_SHARED] == "300"
        assert node["status"][section][names.NVIDIA_GPU] == "3"


def test_a_gpu_held_by_another_device_plugin_is_not_offered(cluster: KubeAPIServer, kube: Kube) -> None:
    devices = _devices(T4)
    held = replace(devices, external_holders=(ExternalHolder(gpu_uuid=devices.gpus[3].uuid, pod_uid="p"),))
    KubeReporter(kube, node_name=NODE).report(held)
    node = cluster.get_object(NODE_PATH)
    assert node is not None and node["status"]["capacity"][names.GPU_CORE] == "300"
    assert names.NVIDIA_GPU not in node["status"]["capacity"]  # not advertised: the NVIDIA plugin's to set


def test_nothing_is_written_when_nothing_changed(cluster: KubeAPIServer, kube: Kube) -> None:
    devices = _devices()
    reporter = KubeReporter(kube, node_name=NODE)
    reporter.report(devices)
    first = cluster.get_object(DEVICE_PATH)
    writes = dict(reporter.writes)
    reporter.report(devices)
    reporter.report(devices)
    assert reporter.writes == writes
    second = cluster.get_object(DEVICE_PATH)
    assert first is not None and second is not None
    assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_a_health_change_replaces_the_device_and_keeps_labels_others_added(cluster: KubeAPIServer, kube: Kube) -> None:
    devices = _devices()
    reporter = KubeReporter(kube, node_name=NODE)
    reporter.report(devices)
    stored = cluster.get_object(DEVICE_PATH)
    assert stored is not None
    stored["metadata"]["labels"]["team"] = "ml"
    cluster.put_object(f"/apis/{names.DEVICE_GROUP}/{names.DEVICE_VERSION}/devices", stored)
    reporter.report(replace(devices, gpus=(replace(devices.gpus[1], healthy=False, health_reason="Xid79"),)))
    after = cluster.get_object(DEVICE_PATH)
    assert after is not None
    assert [d["health"] for d in after["spec"]["devices"]] == [False]
    assert after["metadata"]["labels"]["team"] == "ml"


class RacingKube(Kube):
    """Another writer updates the Device right after each of the first `races` reads."""

    def __init__(self, base: Kube, cluster: KubeAPIServer, races: int) -> None:
        self.__dict__.update(base.__dict__)
        self._cluster = cluster
        self._races = races
        self.replaces = 0

    def get_device(self, name: str) -> JSON | None:
        current = super().get_device(name)
        if current is not None and self._races > 0:
            self._races -= 1
            other = dict(current)
            other["metadata"] = {**current["metadata"], "annotations": {**current["metadata"].get("annotations", {}), "x": str(self._races)}}
            self._cluster.put_object(f"/apis/{names.DEVICE_GROUP}/{names.DEVICE_VERSION}/devices", other)
        return current

    def replace_device(self, name: str, body: JSON) -> JSON:
        self.replaces += 1
        return super().replace_device(name, body)


def test_a_resource_version_conflict_is_read_again_and_retried(cluster: KubeAPIServer, kube: Kube) -> None:
    devices = _devices()
    KubeReporter(kube, node_name=NODE).report(devices)
    racing = RacingKube(kube, cluster, races=2)
    changed = replace(devices, gpus=(replace(devices.gpus[0], healthy=False, health_reason="Xid48"), *devices.gpus[1:]))
    KubeReporter(racing, node_name=NODE).report(changed)
    stored = cluster.get_object(DEVICE_PATH)
    assert stored is not None
    assert racing.replaces == 3  # two real 409s from the server, then success
    assert stored["spec"]["devices"][0]["health"] is False
    assert stored["metadata"]["annotations"]["x"] == "0"  # the other writer's change survived


def test_endless_conflicts_give_up_with_an_error_the_loop_retries(cluster: KubeAPIServer, kube: Kube) -> None:
    devices = _devices()
    KubeReporter(kube, node_name=NODE).report(devices)
    racing = RacingKube(kube, cluster, races=100)
    changed = replace(devices, gpus=devices.gpus[:1])
    with pytest.raises(KubeAPIError, match="still conflicting"):
        KubeReporter(racing, node_name=NODE).report(changed)


def test_a_deleted_device_is_recreated_at_the_next_pass(cluster: KubeAPIServer, kube: Kube) -> None:
    devices = _devices()
    reporter = KubeReporter(kube, node_name=NODE)
    reporter.report(devices)
    someone = client.CustomObjectsApi(config.new_client_from_config(config_file=cluster.kubeconfig_path))  # type: ignore[no-untyped-call]
    someone.delete_cluster_custom_object(  # kubectl delete device
        group=names.DEVICE_GROUP, version=names.DEVICE_VERSION, plural=names.DEVICE_PLURAL, name=NODE
    )
    someone.api_client.close()
    assert cluster.get_object(DEVICE_PATH) is None
    reporter.report(devices)
    assert cluster.get_object(DEVICE_PATH) is not None


def test_a_node_not_yet_registered_gets_an_unowned_device_and_no_error(cluster: KubeAPIServer, kube: Kube) -> None:
    KubeReporter(kube, node_name="not-registered").report(replace(_devices(), node_name="not-registered"))
    stored = cluster.get_object(f"/apis/{names.DEVICE_GROUP}/{names.DEVICE_VERSION}/devices/not-registered")
    assert stored is not None and "ownerReferences" not in stored["metadata"]


def test_the_api_being_down_is_retried_with_backoff_until_it_is_back(cluster: KubeAPIServer) -> None:
    kube = Kube.connect(kubeconfig=cluster.kubeconfig_path, request_timeout_s=0.3)
    metrics = AgentMetrics()
    devices = _devices()
    reporter = KubeReporter(kube, node_name=NODE)
    loop = ReportLoop(
        target="kubernetes", report=lambda: reporter.report(devices), resync_s=60, metrics=metrics,
        backoff_initial_s=0.05, backoff_max_s=0.2,
    )
    cluster.pause()
    try:
        loop.start()
        _wait(lambda: loop.failures >= 2)
        assert cluster.get_object(DEVICE_PATH) is None
    finally:
        cluster.resume()
    _wait(lambda: cluster.get_object(DEVICE_PATH) is not None)
    _wait(lambda: loop.passes == 1)
    loop.stop()
    kube.close()
    assert metrics.report_errors.labels("kubernetes")._value.get() >= 2


def test_server_errors_are_retried_too(cluster: KubeAPIServer, kube: Kube) -> None:
    cluster.fail_next(3, status=500)
    reporter = KubeReporter(kube, node_name=NODE)
    loop = ReportLoop(
        target="kubernetes", report=lambda: reporter.report(_devices()), resync_s=60, metrics=AgentMetrics(),
        backoff_initial_s=0.01, backoff_max_s=0.05,
    )
    loop.start()
    _wait(lambda: loop.passes == 1)
    loop.stop()
    assert loop.failures >= 1 and cluster.get_object(DEVICE_PATH) is not None


