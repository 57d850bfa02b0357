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

Which fact goes where (a Koordinator field of the entry or a key of the extras)
is the field table's, apis/device_fields.py; this module walks it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from apis import device_fields, names
from apis.device_fields import Extra, Field, Kind, Koordinator, Record, Seen
from apis.inventory import LABEL_VALUE_MAX, GPUInfo, NodeDevices
from apis.quantity import QuantityError, format_bytes, parse_quantity

# The name these warnings were always logged under (apis/devices.py before the split).
log = logging.getLogger("apis.devices")

_EXTRAS_VERSION = 1
#: A key the object does not have (as opposed to one set to null).
_ABSENT = object()
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
    values = _read_extras(device_fields.NODE, extras, seen=Seen(labels=labels, entry={}, values={}))
    values["node_name"] = node_name
    values["gpus"] = tuple(gpus)
    devices: NodeDevices = device_fields.build(NodeDevices, values)
    return devices


def from_unique_device_object(obj: Mapping[str, Any]) -> NodeDevices:
    """`from_device_object`, refusing (DeviceError naming both entries) a Device that lists one GPU
    or MIG UUID twice: what the scheduler reads. The plain reader keeps such an object readable
    for tools that show it as it is."""
    devices = from_device_object(obj)
    entries = _mapping(obj.get("spec"), where="spec").get("devices") or []
    places = [
        f"spec.devices[{i}]"
        for i, entry in enumerate(entries)
        if isinstance(entry, Mapping) and entry.get("type") == names.DEVICE_TYPE_GPU
    ]
    check_unique_uuids(devices, what=f"Device {devices.node_name}", places=places)
    return devices


def check_unique_uuids(devices: NodeDevices, *, what: str = "", places: Sequence[str] = ()) -> None:
    """Raises DeviceError naming both entries when two GPUs or MIG instances of `devices` share a UUID.

    The scheduler counts shares by UUID: a GPU listed twice would carry every share on one entry while
    the other looked free forever, so pods could take it whole again and again. `what` names the
    source ("Device n1"); `places[i]` names the i-th GPU there ("spec.devices[2]").
    """
    seen: dict[str, str] = {}
    for i, gpu in enumerate(devices.gpus):
        place = places[i] if i < len(places) else f"GPU {i} (index {gpu.index}, minor {gpu.minor})"
        named = [(gpu.uuid, place)]
        named += [(mig.uuid, f"{place} MIG instance {j}") for j, mig in enumerate(gpu.mig_instances)]
        for uuid, where in named:
            if not uuid:
                continue  # a GPU known by its minor only (an old koordlet): nothing to repeat
            first = seen.setdefault(uuid, where)
            if first != where:
                raise DeviceError(
                    f"{what or 'node ' + devices.node_name}: {where} has UUID {uuid!r}, which {first} has already; "
                    "each GPU and MIG instance must be listed once (fix the agent, or the hand-edited object)"
                )


def _gpu_to_spec(gpu: GPUInfo) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": names.DEVICE_TYPE_GPU}
    for field in device_fields.GPU.fields:
        if isinstance(field.device, Koordinator):
            *path, name = field.device.path
            target = entry
            for part in path:
                target = target.setdefault(part, {})
            target[name] = _to_json(field, device_fields.value_of(gpu, field.attr))
    # Koordinator lists each device's whole capacity: all its compute and memory ratio beside its bytes.
    entry["resources"] = {names.GPU_CORE: "100", **entry.get("resources", {}), names.GPU_MEMORY_RATIO: "100"}
    return entry


def _gpu_from_spec(
    entry: Mapping[str, Any], *, labels: Mapping[str, Any], extras: Mapping[str, Any], where: str
) -> GPUInfo:
    values: dict[str, object] = {}
    seen = Seen(labels=labels, entry=entry, values=values)
    for field in device_fields.GPU.fields:
        if isinstance(field.device, Koordinator):
            values[field.attr] = _read_spec(field, field.device.path, entry, seen=seen, where=where)
    uuid = values["uuid"]
    extra = _loose_mapping(extras.get(uuid) if isinstance(uuid, str) and uuid else None)
    values.update(_read_extras(device_fields.GPU, extra, seen=seen))
    gpu: GPUInfo = device_fields.build(GPUInfo, values)
    return gpu


def _extras_of(record: Record, value: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in record.fields:
        if not isinstance(field.device, Extra):
            continue
        data = device_fields.value_of(value, field.attr)
        if field.omit_default and data == device_fields.default_of(record.cls, field.attr):
            continue
        out[field.device.key] = _to_json(field, data)
    return out


def _to_json(field: Field, data: Any) -> Any:
    if field.kind is Kind.BYTES:
        return format_bytes(data)
    if field.kind is Kind.RECORDS:
        assert field.records is not None
        records = field.records
        return [_extras_of(records, item) for item in data]
    return data


def _read_spec(field: Field, path: tuple[str, ...], entry: Mapping[str, Any], *, seen: Seen, where: str) -> object:
    """A Koordinator field of a spec entry; its objects must be objects, its minor and memory readable."""
    target: Mapping[str, Any] = entry
    for i, part in enumerate(path[:-1]):
        target = _mapping(target.get(part), where=where + _path_text(path[: i + 1]))
    place = where + _path_text(path)
    raw = target.get(path[-1], _ABSENT)
    if field.kind is Kind.MINOR:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            shown = None if raw is _ABSENT else raw
            raise DeviceError(f"{place}={shown!r} must be an integer >= 0 (the N of /dev/nvidiaN)")
        return raw
    if field.kind is Kind.BYTES:
        return _whole_bytes(0 if raw is _ABSENT else raw, field=place)
    return _from_json(field, None if raw is _ABSENT else raw, record=device_fields.GPU, seen=seen)


def _read_extras(record: Record, extra: Mapping[str, Any], *, seen: Seen) -> dict[str, object]:
    return {
        field.attr: _from_json(field, extra.get(field.device.key), record=record, seen=seen)
        for field in record.fields
        if isinstance(field.device, Extra)
    }


def _from_json(field: Field, raw: object, *, record: Record, seen: Seen) -> object:
    """Tolerant: a value of the wrong type reads as the default, as a missing one does."""
    if field.kind in (Kind.FLAG, Kind.HEALTH):
        return raw is True
    if field.kind is Kind.RECORDS:
        assert field.records is not None
        records = field.records
        items = []
        for item in _list_of_mappings(raw):
            values = _read_extras(records, item, seen=Seen(labels=seen.labels, entry=item, values={}))
            items.append(device_fields.build(records.cls, values))
        return tuple(items)
    if field.kind is Kind.TEXT and isinstance(raw, str):
        return raw
    if field.kind is Kind.NUMBER and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if field.fallback is not None:
        return field.fallback(seen)
    default = device_fields.default_of(record.cls, field.attr)
    if default is not dataclasses.MISSING:
        return default
    return "" if field.kind is Kind.TEXT else 0


def _whole_bytes(raw: object, *, field: str) -> int:
    try:
        quantity = parse_quantity(raw, field=field)
    except QuantityError as exc:
        raise DeviceError(str(exc)) from exc
    except ValueError as exc:  # NaN and Infinity
        raise DeviceError(f"{field}={raw!r} is not a finite quantity") from exc
    if quantity < 0 or quantity.denominator != 1:
        raise DeviceError(f"{field}={raw!r} must be a whole number of bytes")
    return int(quantity)


def _path_text(path: tuple[str, ...]) -> str:
    """("resources", "koordinator.sh/gpu-memory") -> ".resources[koordinator.sh/gpu-memory]"."""
    return f".{path[0]}" + "".join(f"[{part}]" for part in path[1:])


def _encode_extras(devices: NodeDevices) -> str:
    extras = {
        "version": _EXTRAS_VERSION,
        **_extras_of(device_fields.NODE, devices),
        "gpus": {g.uuid: _extras_of(device_fields.GPU, g) for g in devices.gpus if g.uuid},
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
