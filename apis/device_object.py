"""`NodeDevices` as the Koordinator-compatible Device object, both ways.

The agent publishes a node's inventory as a `scheduling.koordinator.sh/v1alpha1`
Device object, one per node, named after it; the scheduler's Kubernetes
backend reads it back.

Koordinator's Device schema has no field for NVLink peers, MIG instances,
the NVML model name, GPUs held outside fgpu or driver versions per node;
those travel in the `fgpu.io/device-extras` annotation as JSON, e.g.::

    {"cudaDriverVersion":"12.4","discoveryError":"","driverVersion":"550.54.15",
     "externalHolders":[],"gpus":{"GPU-8f2b":{"healthReason":"","index":0,
     "migEnabled":false,"migInstances":[],"model":"NVIDIA A100-SXM4-80GB",
     "modelLabel":"A100-SXM4-80GB","nvlinkPeers":[],"vendor":"nvidia"}},"version":1}

A Device written by Koordinator's koordlet has no such annotation and reads
fine: the missing facts take their defaults.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from apis import names
from apis.inventory import (
    LABEL_VALUE_MAX,
    ExternalHolder,
    GPUInfo,
    MIGInstance,
    NodeDevices,
    NVLinkPeer,
    Topology,
)
from apis.quantity import QuantityError, format_bytes, parse_quantity

# The name these warnings were always logged under (apis/devices.py before the split).
log = logging.getLogger("apis.devices")

_EXTRAS_VERSION = 1
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class DeviceError(ValueError):
    """A Device object that cannot be read."""


def to_device_object(devices: NodeDevices, *, node_uid: str | None = None) -> dict[str, Any]:
    """The Koordinator-compatible Device object for `devices`, named after the node.

    With `node_uid`, the Node owns the Device, so deleting the node deletes it.
    """
    labels: dict[str, str] = {}
    if devices.gpus:
        labels[names.NODE_GPU_VENDOR] = devices.gpus[0].vendor
        labels[names.NODE_GPU_MODEL] = devices.gpus[0].model_label
    if devices.driver_version:
        labels[names.NODE_GPU_DRIVER_VERSION] = devices.driver_version
    metadata: dict[str, Any] = {
        "name": devices.node_name,
        "labels": {k: v for k, v in labels.items() if v and _is_label_value(v)},
        "annotations": {names.DEVICE_EXTRAS: _encode_extras(devices)},
    }
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": devices.node_name, "uid": node_uid}
        ]
    return {
        "apiVersion": f"{names.DEVICE_GROUP}/{names.DEVICE_VERSION}",
        "kind": names.DEVICE_KIND,
        "metadata": metadata,
        "spec": {"devices": [_gpu_to_spec(g) for g in devices.gpus]},
    }


def from_device_object(obj: Mapping[str, Any]) -> NodeDevices:
    """`NodeDevices` from a Device object written by fgpu's agent or by Koordinator's koordlet.

    Devices of other types ("rdma", "fpga") are skipped. Raises DeviceError
    naming the field when a GPU entry cannot be read.
    """
    metadata = _mapping(obj.get("metadata"), where="metadata")
    node_name = metadata.get("name")
    if not isinstance(node_name, str) or not node_name:
        raise DeviceError(f"Device: metadata.name={node_name!r} must be the node name")
    labels = _mapping(metadata.get("labels"), where="metadata.labels")
    annotations = _mapping(metadata.get("annotations"), where="metadata.annotations")
    extras = _decode_extras(annotations.get(names.DEVICE_EXTRAS), device_name=node_name)
    spec = _mapping(obj.get("spec"), where="spec")
    entries = spec.get("devices")
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise DeviceError(f"Device {node_name}: spec.devices must be a list, got {type(entries).__name__}")
    gpu_extras = _loose_mapping(extras.get("gpus"))
    gpus = []
    for i, entry in enumerate(entries):
        where = f"Device {node_name}: spec.devices[{i}]"
        if not isinstance(entry, Mapping):
            raise DeviceError(f"{where} must be an object")
        if entry.get("type") != names.DEVICE_TYPE_GPU:
            continue
        gpus.append(_gpu_from_spec(entry, labels=labels, extras=gpu_extras, where=where))
    return NodeDevices(
        node_name=node_name,
        gpus=tuple(gpus),
        driver_version=_str(extras.get("driverVersion"), labels.get(names.NODE_GPU_DRIVER_VERSION, "")),
        cuda_driver_version=_str(extras.get("cudaDriverVersion"), ""),
        external_holders=tuple(
            ExternalHolder(
                gpu_uuid=_str(h.get("gpuUUID"), ""),
                pod_uid=_str(h.get("podUID"), ""),
                container_name=_str(h.get("containerName"), ""),
                resource_name=_str(h.get("resourceName"), ""),
            )
            for h in _list_of_mappings(extras.get("externalHolders"))
        ),
        discovery_error=_str(extras.get("discoveryError"), ""),
    )


def _gpu_to_spec(gpu: GPUInfo) -> dict[str, Any]:
    topo = gpu.topology
    return {
        "type": names.DEVICE_TYPE_GPU,
        "id": gpu.uuid,
        "minor": gpu.minor,
        "health": gpu.healthy,
        "resources": {
            names.GPU_CORE: "100",
            names.GPU_MEMORY: format_bytes(gpu.memory_bytes),
            names.GPU_MEMORY_RATIO: "100",
        },
        "topology": {
            "socketID": topo.socket_id,
            "nodeID": topo.numa_node,
            "pcieID": topo.pcie_root,
            "busID": topo.bus_id,
        },
    }


def _gpu_from_spec(
    entry: Mapping[str, Any], *, labels: Mapping[str, Any], extras: Mapping[str, Any], where: str
) -> GPUInfo:
    uuid = _str(entry.get("id"), "")
    minor = entry.get("minor")
    if isinstance(minor, bool) or not isinstance(minor, int) or minor < 0:
        raise DeviceError(f"{where}.minor={minor!r} must be an integer >= 0 (the N of /dev/nvidiaN)")
    resources = _mapping(entry.get("resources"), where=f"{where}.resources")
    memory = resources.get(names.GPU_MEMORY, 0)
    try:
        memory_q = parse_quantity(memory, field=f"{where}.resources[{names.GPU_MEMORY}]")
    except QuantityError as exc:
        raise DeviceError(str(exc)) from exc
    except ValueError as exc:  # NaN and Infinity
        raise DeviceError(f"{where}.resources[{names.GPU_MEMORY}]={memory!r} is not a finite quantity") from exc
    if memory_q < 0 or memory_q.denominator != 1:
        raise DeviceError(f"{where}.resources[{names.GPU_MEMORY}]={memory!r} must be a whole number of bytes")
    topo = _mapping(entry.get("topology"), where=f"{where}.topology")
    extra = _loose_mapping(extras.get(uuid) if uuid else None)
    label_model = _str(labels.get(names.NODE_GPU_MODEL), "")
    healthy = entry.get("health") is True
    return GPUInfo(
        uuid=uuid,
        minor=minor,
        index=_int(extra.get("index"), minor),
        model=_str(extra.get("model"), label_model),
        model_label=_str(extra.get("modelLabel"), label_model),
        memory_bytes=int(memory_q),
        healthy=healthy,
        health_reason=_str(extra.get("healthReason"), "" if healthy else _condition_reason(entry)),
        topology=Topology(
            numa_node=_int(topo.get("nodeID"), -1),
            socket_id=_int(topo.get("socketID"), -1),
            pcie_root=_str(topo.get("pcieID"), ""),
            bus_id=_str(topo.get("busID"), ""),
            nvlink_peers=tuple(
                NVLinkPeer(bus_id=_str(p.get("busID"), ""), uuid=_str(p.get("uuid"), ""), links=_int(p.get("links"), 1))
                for p in _list_of_mappings(extra.get("nvlinkPeers"))
            ),
        ),
        vendor=_str(extra.get("vendor"), _str(labels.get(names.NODE_GPU_VENDOR), "nvidia")),
        mig_enabled=extra.get("migEnabled") is True,
        mig_instances=tuple(
            MIGInstance(
                uuid=_str(m.get("uuid"), ""),
                profile=_str(m.get("profile"), ""),
                memory_bytes=_int(m.get("memoryBytes"), 0),
                slices=_int(m.get("slices"), 0),
                gpu_instance_id=_int(m.get("gpuInstanceID"), 0),
                compute_instance_id=_int(m.get("computeInstanceID"), 0),
                index=_int(m.get("index"), 0),
            )
            for m in _list_of_mappings(extra.get("migInstances"))
        ),
    )


def _encode_extras(devices: NodeDevices) -> str:
    extras = {
        "version": _EXTRAS_VERSION,
        "driverVersion": devices.driver_version,
        "cudaDriverVersion": devices.cuda_driver_version,
        "discoveryError": devices.discovery_error,
        "externalHolders": [
            {"gpuUUID": h.gpu_uuid, "podUID": h.pod_uid, "containerName": h.container_name, "resourceName": h.resource_name}
            for h in devices.external_holders
        ],
        "gpus": {
            g.uuid: {
                "index": g.index,
                "model": g.model,
                "modelLabel": g.model_label,
                "vendor": g.vendor,
                "healthReason": g.health_reason,
                "migEnabled": g.mig_enabled,
                "migInstances": [
                    {
                        "uuid": m.uuid,
                        "profile": m.profile,
                        "memoryBytes": m.memory_bytes,
                        "slices": m.slices,
                        "gpuInstanceID": m.gpu_instance_id,
                        "computeInstanceID": m.compute_instance_id,
                        "index": m.index,
                    }
                    for m in g.mig_instances
                ],
                "nvlinkPeers": [{"busID": p.bus_id, "uuid": p.uuid, "links": p.links} for p in g.topology.nvlink_peers],
            }
            for g in devices.gpus
            if g.uuid
        },
    }
    return json.dumps(extras, sort_keys=True, separators=(",", ":"))


def _decode_extras(text: object, *, device_name: str) -> Mapping[str, Any]:
    if text is None:
        return {}
    try:
        data = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError) as exc:
        data = None
        log.warning("Device %s: ignoring annotation %s, not JSON: %s", device_name, names.DEVICE_EXTRAS, exc)
    if not isinstance(data, dict):
        # Extras only refine the picture; a node stays schedulable without them.
        log.warning("Device %s: ignoring annotation %s, not a JSON object", device_name, names.DEVICE_EXTRAS)
        return {}
    return data


def _condition_reason(entry: Mapping[str, Any]) -> str:
    for cond in _list_of_mappings(entry.get("conditions")):
        if cond.get("status") == "False":
            return _str(cond.get("reason"), "") or _str(cond.get("message"), "")
    return ""


def _is_label_value(value: str) -> bool:
    return len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.match(value) is not None


def _mapping(value: object, *, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DeviceError(f"{where} must be an object, got {type(value).__name__}")
    return value


def _loose_mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list_of_mappings(value: object) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, Mapping)]


def _str(value: object, default: str) -> str:
    return value if isinstance(value, str) else default


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
