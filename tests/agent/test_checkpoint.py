"""kubelet's device-manager checkpoint: GPUs other device plugins handed out."""

from __future__ import annotations

import os
import shutil

import pytest

from agent.checkpoint import (
    CheckpointError,
    CheckpointReader,
    external_holders,
    parse_checkpoint,
    read_checkpoint,
)
from agent.config import AgentConfig
from agent.discovery import discover
from agent.pcitopology import InventoryTopology
from apis import names
from apis.devices import ExternalHolder, NodeDevices
from tests.agent.helpers import MIXED, data_file, started_fake


def _mixed_devices() -> NodeDevices:
    nvml, inventory = started_fake(MIXED)
    return discover(nvml, node_name="n", topology=InventoryTopology(inventory)).devices


def test_the_sample_checkpoint_lists_every_entry_with_numa_keyed_device_ids() -> None:
    entries = read_checkpoint(data_file("kubelet_internal_checkpoint"))
    assert [(e.container_name, e.resource_name, len(e.device_ids)) for e in entries] == [
        ("trainer", "nvidia.com/gpu", 2),
        ("infer", "nvidia.com/mig-1g.5gb", 1),
        ("nic", "rdma/hca", 1),
    ]


def test_gpus_held_by_the_nvidia_plugin_become_external_holders_by_default() -> None:
    devices = _mixed_devices()
    entries = read_checkpoint(data_file("kubelet_internal_checkpoint"))
    default = AgentConfig().external_resources
    assert default == (names.NVIDIA_GPU, names.NVIDIA_MIG_RESOURCE_PREFIX + "*")
    holders = external_holders(entries, devices=devices, resource_names=default)
    assert holders == (
        ExternalHolder(devices.gpus[1].uuid, "b7e1c2d3-4f5a-4b6c-8d7e-9f0a1b2c3d4e", "trainer", "nvidia.com/gpu"),
        # A time-sliced replica ("::2") is the GPU itself.
        ExternalHolder(devices.gpus[2].uuid, "b7e1c2d3-4f5a-4b6c-8d7e-9f0a1b2c3d4e", "trainer", "nvidia.com/gpu"),
        # A MIG device is held on its parent GPU.
        ExternalHolder(devices.gpus[0].uuid, "c8f2d3e4-5a6b-4c7d-9e8f-0a1b2c3d4e5f", "infer", "nvidia.com/mig-1g.5gb"),
    )


def test_resources_not_configured_are_not_counted() -> None:
    entries = read_checkpoint(data_file("kubelet_internal_checkpoint"))
    holders = external_holders(entries, devices=_mixed_devices(), resource_names=["nvidia.com/gpu"])
    assert {h.resource_name for h in holders} == {"nvidia.com/gpu"}


def test_the_pre_1_20_format_with_index_device_ids_is_read() -> None:
    entries = read_checkpoint(data_file("kubelet_internal_checkpoint.pre-1.20"))
    devices = _mixed_devices()
    holders = external_holders(entries, devices=devices, resource_names=["nvidia.com/gpu"])
    assert [(h.gpu_uuid, h.container_name) for h in holders] == [(devices.gpus[2].uuid, "legacy")]


def test_a_missing_checkpoint_means_no_external_holders(tmp_path: object) -> None:
    assert read_checkpoint(os.path.join(str(tmp_path), "absent")) == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ("[]", "no Data object"),
        ('{"Data": {"PodDeviceEntries": {}}}', "PodDeviceEntries is dict"),
        ('{"Data": {"PodDeviceEntries": [{"DeviceIDs": {"0": "GPU-1"}}]}}', r"DeviceIDs\['0'\] is str"),
    ],
)
def test_a_corrupt_checkpoint_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        parse_checkpoint(text)


def test_the_reader_keeps_the_last_good_entries_when_the_file_turns_corrupt(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "kubelet_internal_checkpoint")
    shutil.copy(data_file("kubelet_internal_checkpoint"), path)
    reader = CheckpointReader(path)
    good = reader.entries()
    with open(path, "w") as f:
        f.write('{"Data": ')  # kubelet mid-write
    assert reader.entries() == good
    os.remove(path)
    assert reader.entries() == ()
