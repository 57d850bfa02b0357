"""The node inventory and its two wire forms: the gRPC report and the Koordinator Device object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from apis import names
from apis.devices import (
    DeviceError,
    ExternalHolder,
    GPUInfo,
    MIGInstance,
    NodeDevices,
    NVLinkPeer,
    Topology,
    from_device_object,
    from_proto,
    model_label,
    to_device_object,
    to_proto,
)
from apis.fgpu.v1 import device_pb2
from tests.apis_codec.crd_schema import pruned_paths, validation_errors
from tests.apis_codec.strategies import node_devices

KOORDLET_DEVICE = Path(__file__).with_name("koordlet_device.yaml")

A100 = GPUInfo(
    uuid="GPU-0",
    minor=0,
    index=0,
    model="NVIDIA A100-SXM4-80GB",
    model_label="A100-SXM4-80GB",
    memory_bytes=80 * 2**30,
    topology=Topology(
        numa_node=0,
        socket_id=0,
        pcie_root="pci0000:17",
        bus_id="00000000:18:00.0",
        nvlink_peers=(NVLinkPeer(bus_id="00000000:2A:00.0", uuid="GPU-1", links=12),),
    ),
)
MIG_A100 = GPUInfo(
    uuid="GPU-1",
    minor=1,
    index=1,
    model="NVIDIA A100-SXM4-80GB",
    model_label="A100-SXM4-80GB",
    memory_bytes=80 * 2**30,
    healthy=False,
    health_reason="Xid79",
    mig_enabled=True,
    mig_instances=(
        MIGInstance(uuid="MIG-a", profile="3g.40gb", memory_bytes=40 * 2**30, slices=3, gpu_instance_id=1, index=0),
    ),
)
NODE = NodeDevices(
    node_name="n1",
    gpus=(A100, MIG_A100),
    driver_version="550.54.15",
    cuda_driver_version="12.4",
    external_holders=(ExternalHolder(gpu_uuid="GPU-9", pod_uid="p1", container_name="c", resource_name="nvidia.com/gpu"),),
)


def through_api_server(obj: dict[str, Any]) -> dict[str, Any]:
    """What a reader gets back: JSON on the wire, minus what the CRD schema prunes."""
    assert pruned_paths(obj) == []
    assert validation_errors(obj) == []
    result: dict[str, Any] = json.loads(json.dumps(obj))
    return result


@pytest.mark.parametrize(
    ("nvml_name", "label"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"),
        ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090"),
        ("NVIDIA Tesla P100-PCIE-16GB", "P100-PCIE-16GB"),
        ("  Quadro RTX 6000 ", "Quadro-RTX-6000"),
        ("NVIDIA A800 (80GB) / PCIe", "A800-80GB-PCIe"),
        ("NVIDIA " + "X" * 80, "X" * 63),
        ("", ""),
    ],
)
def test_model_label_is_the_label_safe_model_without_vendor_prefixes(nvml_name: str, label: str) -> None:
    assert model_label(nvml_name) == label


# --- protobuf ---------------------------------------------------------------------------


def test_report_carries_health_as_the_proto_enum() -> None:
    report = to_proto(NODE)

    assert [g.health for g in report.gpus] == [device_pb2.HEALTHY, device_pb2.UNHEALTHY]
    assert report.gpus[1].health_reason == "Xid79"


def test_a_gpu_whose_health_nobody_reported_counts_as_unhealthy() -> None:
    report = device_pb2.NodeDeviceReport(node_name="n1", gpus=[device_pb2.GPU(uuid="GPU-0")])

    assert from_proto(report).gpus[0].healthy is False


def test_a_gpu_without_topology_reads_as_unknown_numa_node_and_socket() -> None:
    report = device_pb2.NodeDeviceReport(node_name="n1", gpus=[device_pb2.GPU(uuid="GPU-0")])

    assert from_proto(report).gpus[0].topology == Topology()


@given(node_devices())
def test_any_inventory_survives_proto_and_back(devices: NodeDevices) -> None:
    wire = to_proto(devices).SerializeToString()

    assert from_proto(device_pb2.NodeDeviceReport.FromString(wire)) == devices


# --- Device object ------------------------------------------------------------------------


def test_device_object_is_named_after_the_node_and_has_koordinator_fields() -> None:
    obj = to_device_object(NODE)

    assert obj["apiVersion"] == "scheduling.koordinator.sh/v1alpha1"
    assert obj["kind"] == "Device"
    assert obj["metadata"]["name"] == "n1"
    assert obj["metadata"]["labels"] == {
        names.NODE_GPU_VENDOR: "nvidia",
        names.NODE_GPU_MODEL: "A100-SXM4-80GB",
        names.NODE_GPU_DRIVER_VERSION: "550.54.15",
    }
    assert obj["spec"]["devices"][0] == {
        "type": "gpu",
        "id": "GPU-0",
        "minor": 0,
        "health": True,
        "resources": {names.GPU_CORE: "100", names.GPU_MEMORY: "80Gi", names.GPU_MEMORY_RATIO: "100"},
        "topology": {"socketID": 0, "nodeID": 0, "pcieID": "pci0000:17", "busID": "00000000:18:00.0"},
    }
    assert obj["spec"]["devices"][1]["health"] is False


def test_device_object_is_owned_by_its_node_when_the_node_uid_is_given() -> None:
    assert "ownerReferences" not in to_device_object(NODE)["metadata"]

    refs = to_device_object(NODE, node_uid="uid-n1")["metadata"]["ownerReferences"]

    assert refs == [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-n1"}]


def test_facts_koordinator_has_no_field_for_travel_in_the_extras_annotation() -> None:
    extras = json.loads(to_device_object(NODE)["metadata"]["annotations"][names.DEVICE_EXTRAS])

    assert extras["driverVersion"] == "550.54.15"
    assert extras["cudaDriverVersion"] == "12.4"
    assert extras["externalHolders"] == [
        {"gpuUUID": "GPU-9", "podUID": "p1", "containerName": "c", "resourceName": "nvidia.com/gpu"}
    ]
    assert extras["gpus"]["GPU-0"]["nvlinkPeers"] == [{"busID": "00000000:2A:00.0", "uuid": "GPU-1", "links": 12}]
    assert extras["gpus"]["GPU-1"]["migInstances"][0]["profile"] == "3g.40gb"


def test_labels_that_kubernetes_would_reject_are_left_out_but_kept_in_extras() -> None:
    node = NodeDevices(node_name="n1", gpus=(A100,), driver_version="550 beta+1")

    obj = to_device_object(node)

    assert names.NODE_GPU_DRIVER_VERSION not in obj["metadata"]["labels"]
    assert from_device_object(through_api_server(obj)).driver_version == "550 beta+1"


def test_device_object_passes_the_crd_schema_without_losing_a_field() -> None:
    assert from_device_object(through_api_server(to_device_object(NODE, node_uid="u"))) == NODE


def test_a_node_whose_discovery_failed_publishes_the_error_and_no_gpus() -> None:
    node = NodeDevices(node_name="n1", discovery_error="NVML: driver not loaded")

    obj = through_api_server(to_device_object(node))

    assert obj["spec"]["devices"] == []
    assert from_device_object(obj) == node


@given(node_devices())
def test_any_inventory_survives_the_device_object_and_back(devices: NodeDevices) -> None:
    assert from_device_object(through_api_server(to_device_object(devices))) == devices


def test_reads_a_device_written_by_koordlet() -> None:
    obj = yaml.safe_load(KOORDLET_DEVICE.read_text())
    assert validation_errors(obj) == []

    devices = from_device_object(obj)

    assert devices == NodeDevices(
        node_name="gpu-node-7",
        driver_version="535.104.05",
        gpus=(
            GPUInfo(
                uuid="GPU-04f8c5a1-6d2b-4c7e-9a31-1d2e3f4a5b6c",
                minor=0,
                index=0,
                model="A100-SXM4-80GB",
                model_label="A100-SXM4-80GB",
                memory_bytes=80 * 2**30,
                topology=Topology(numa_node=0, socket_id=0, pcie_root="pci0000:17", bus_id="0000:18:00.0"),
            ),
            GPUInfo(
                uuid="GPU-9b1e7d20-3c4f-4a8b-b5d6-e7f8091a2b3c",
                minor=1,
                index=1,
                model="A100-SXM4-80GB",
                model_label="A100-SXM4-80GB",
                memory_bytes=80 * 2**30,
                healthy=False,
                health_reason="Xid79",
                topology=Topology(numa_node=1, socket_id=1, pcie_root="pci0000:ae"),
            ),
        ),
    )


def test_a_malformed_extras_annotation_is_ignored_rather_than_hiding_the_node() -> None:
    obj = through_api_server(to_device_object(NODE))
    obj["metadata"]["annotations"][names.DEVICE_EXTRAS] = "{not json"

    devices = from_device_object(obj)

    assert [g.uuid for g in devices.gpus] == ["GPU-0", "GPU-1"]
    assert devices.gpus[0].topology.nvlink_peers == ()
    assert devices.gpus[0].model == "A100-SXM4-80GB"


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        pytest.param(lambda o: o["metadata"].pop("name"), "metadata.name=None", id="no-name"),
        pytest.param(lambda o: o["spec"].update(devices={}), "spec.devices must be a list", id="devices-not-list"),
        pytest.param(lambda o: o["spec"]["devices"].append("gpu"), "spec.devices[2] must be an object", id="entry-str"),
        pytest.param(lambda o: o["spec"]["devices"][1].update(minor="1"), "spec.devices[1].minor='1'", id="minor-str"),
        pytest.param(lambda o: o["spec"]["devices"][0].pop("minor"), "spec.devices[0].minor=None", id="no-minor"),
        pytest.param(
            lambda o: o["spec"]["devices"][0]["resources"].update({names.GPU_MEMORY: "lots"}),
            "spec.devices[0].resources[koordinator.sh/gpu-memory]: 'lots' is not a quantity",
            id="memory-not-quantity",
        ),
        pytest.param(
            lambda o: o["spec"]["devices"][0]["resources"].update({names.GPU_MEMORY: float("inf")}),
            "resources[koordinator.sh/gpu-memory]=inf is not a finite quantity",
            id="memory-infinite",
        ),
        pytest.param(
            lambda o: o["spec"]["devices"][0]["resources"].update({names.GPU_MEMORY: "0.5"}),
            "must be a whole number of bytes",
            id="memory-fractional",
        ),
        pytest.param(
            lambda o: o["spec"]["devices"][0].update(topology=[0]), "spec.devices[0].topology must be an object",
            id="topology-list",
        ),
    ],
)
def test_a_gpu_entry_that_cannot_be_read_is_named_in_the_error(mutate: Any, fragment: str) -> None:
    obj = through_api_server(to_device_object(NODE))
    mutate(obj)

    with pytest.raises(DeviceError) as err:
        from_device_object(obj)

    assert fragment in str(err.value)
    assert "Device" in str(err.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3),
    max_leaves=10,
)
DEVICE_FIELDS = ("id", "minor", "health", "resources", "topology", "type", "conditions")


@given(
    field=st.sampled_from(DEVICE_FIELDS),
    value=json_values | st.dictionaries(st.sampled_from([names.GPU_MEMORY, "nodeID", "pcieID"]), json_values),
    extras=st.none() | st.text() | json_values.map(json.dumps),
)
def test_any_damaged_device_reads_or_fails_with_a_device_error_never_anything_else(
    field: str, value: object, extras: str | None
) -> None:
    obj = through_api_server(to_device_object(NODE))
    obj["spec"]["devices"][0][field] = value
    obj["metadata"]["annotations"][names.DEVICE_EXTRAS] = extras

    try:
        devices = from_device_object(obj)
    except DeviceError as err:
        assert "Device n1: spec.devices[0]" in str(err)
    else:
        assert devices.node_name == "n1"
