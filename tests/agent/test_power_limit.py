"""A GPU's power limit, end to end: inventory -> fake NVML -> discovery -> both wire forms."""

from __future__ import annotations

import json

import pytest

from agent.discovery import discover
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import InventoryError, parse_inventory
from agent.pcitopology import InventoryTopology
from apis import names
from apis.devices import NodeDevices, from_device_object, from_proto, to_device_object, to_proto
from apis.fgpu.v1 import device_pb2


def _gpu(n: int, **overrides: object) -> dict[str, object]:
    gpu: dict[str, object] = {
        "uuid": f"GPU-00000000-0000-4000-8000-00000000000{n}",
        "name": "NVIDIA H100 80GB HBM3",
        "memory": "80Gi",
        "busId": f"00000000:{0x18 + n:02X}:00.0",
    }
    gpu.update(overrides)
    return gpu


def _discovered(*gpus: dict[str, object]) -> NodeDevices:
    inventory = parse_inventory({"gpus": list(gpus)})
    nvml = FakeNVML(inventory)
    nvml.nvmlInit()
    return discover(nvml, node_name="n1", topology=InventoryTopology(inventory)).devices


def test_discovery_reports_the_power_limit_nvml_gives_and_zero_where_it_has_none() -> None:
    devices = _discovered(_gpu(0, powerLimitWatts=700), _gpu(1))

    assert [g.power_limit_watts for g in devices.gpus] == [700, 0]


def test_the_power_limit_travels_in_the_report_and_the_device_object() -> None:
    devices = _discovered(_gpu(0, powerLimitWatts=700), _gpu(1))

    report = to_proto(devices)
    obj = json.loads(json.dumps(to_device_object(devices)))
    extras = json.loads(obj["metadata"]["annotations"][names.DEVICE_EXTRAS])

    assert [g.power_limit_watts for g in report.gpus] == [700, 0]
    assert from_proto(device_pb2.NodeDeviceReport.FromString(report.SerializeToString())) == devices
    assert from_device_object(obj) == devices
    assert extras["gpus"][devices.gpus[0].uuid]["powerLimitWatts"] == 700
    # A GPU without one keeps the extras it always had.
    assert "powerLimitWatts" not in extras["gpus"][devices.gpus[1].uuid]


@pytest.mark.parametrize("value", [0, -5, "700W", True])
def test_an_inventory_power_limit_must_be_whole_positive_watts(value: object) -> None:
    with pytest.raises(InventoryError, match=r"gpus\[0\]\.powerLimitWatts"):
        parse_inventory({"gpus": [_gpu(0, powerLimitWatts=value)]})
