"""A node's GPU inventory as plain values, and its two wire forms.

The agent discovers a `NodeDevices` through NVML and publishes it either as a
`fgpu.v1.NodeDeviceReport` (ReportDevices over gRPC) or as the
Koordinator-compatible `scheduling.koordinator.sh/v1alpha1` Device object, one
per node, named after it. The scheduler reads either back into the same
`NodeDevices`, so both state backends feed it identical data.

The values live in apis/inventory.py, where each of their fields travels in
apis/device_fields.py, the gRPC form in apis/device_report.py and the Device
object (with its `fgpu.io/device-extras` annotation) in apis/device_object.py;
this module gathers their public names so that callers import one place.
"""

from __future__ import annotations

from apis.device_object import DeviceError, from_device_object, to_device_object
from apis.device_report import from_proto, gpu_from_proto, gpu_to_proto, to_proto
from apis.inventory import (
    ExternalHolder,
    GPUInfo,
    MIGInstance,
    NodeDevices,
    NVLinkPeer,
    Topology,
    model_label,
)

__all__ = [
    "DeviceError",
    "ExternalHolder",
    "GPUInfo",
    "MIGInstance",
    "NVLinkPeer",
    "NodeDevices",
    "Topology",
    "from_device_object",
    "from_proto",
    "gpu_from_proto",
    "gpu_to_proto",
    "model_label",
    "to_device_object",
    "to_proto",
]
