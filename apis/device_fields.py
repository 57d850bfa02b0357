"""The field table of a node's GPU report: every fact, where it travels in each wire form.

One row per fact of `apis.inventory` (a `GPUInfo`, its topology, MIG instances
and NVLink peers, and the node-wide facts of `NodeDevices`). The two codecs
walk these tables and nothing else, so a fact added here is carried by both:

- `apis.device_report`: the `fgpu.v1` message (ReportDevices), at `proto`;
- `apis.device_object`: the Koordinator Device object, at `device`: one of
  Koordinator's own fields of a `spec.devices[]` entry (`Koordinator`), or a key
  of fgpu's `fgpu.io/device-extras` JSON (`Extra`).

A new fact of a GPU is one `Field` in `GPU`, its proto field (device.proto) and
where the agent reads it (NVML discovery and the fake). Koordinator's schema is
fixed, so new facts go to the extras, with `omit_default` so that Devices of
nodes without the fact keep the bytes they had. tests/apis_codec/test_device_fields.py
round-trips a value with every field set through both forms, so a dataclass
field the table misses fails there.

Reading a Device written by Koordinator's koordlet (no extras), a missing value
takes the field's `fallback` when it has one (the node's labels, the spec entry,
a value read before it), else the dataclass default, else the kind's zero.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from apis import names
from apis.inventory import ExternalHolder, GPUInfo, MIGInstance, NodeDevices, NVLinkPeer
from apis.mig import MIGPlacement, MIGProfile


class Kind(Enum):
    """How a value is written in each form; the codecs hold one conversion per kind."""

    #: str; a JSON string, anything else reads as the default.
    TEXT = auto()
    #: int; a JSON integer (not a boolean), anything else reads as the default.
    NUMBER = auto()
    #: bool; only JSON `true` reads as true.
    FLAG = auto()
    #: bool `healthy`; the `fgpu.v1.Health` enum (unspecified reads as unhealthy), Device `health: true`.
    HEALTH = auto()
    #: int >= 0, the N of /dev/nvidiaN; a Device entry without one cannot be read (DeviceError).
    MINOR = auto()
    #: int bytes; a Device quantity ("80Gi"), read strictly (DeviceError).
    BYTES = auto()
    #: a tuple of records described by `Field.records`; a repeated message, a JSON list of objects.
    RECORDS = auto()


@dataclass(frozen=True)
class Koordinator:
    """A field of Koordinator's `DeviceInfo` (`spec.devices[]`), by path: ("topology", "nodeID")."""

    path: tuple[str, ...]


@dataclass(frozen=True)
class Extra:
    """A key of fgpu's extras JSON: of the GPU's object, the node's, or a record's."""

    key: str


@dataclass(frozen=True)
class Seen:
    """What a Device reader has when a value is missing: the node's labels, the spec entry, values read so far."""

    labels: Mapping[str, Any]
    entry: Mapping[str, Any]
    values: Mapping[str, object]


@dataclass(frozen=True)
class Field:
    """One fact: `attr` in the dataclass (dotted into nested values), `proto` in the message."""

    attr: str
    proto: str
    device: Koordinator | Extra
    kind: Kind
    #: RECORDS only: the table of each record.
    records: Record | None = None
    #: Device reading: the value when the object does not carry one (e.g. koordlet wrote it).
    fallback: Callable[[Seen], object] | None = None
    #: Extras only: left out while the value is the default (for facts added after a node's Device was written).
    omit_default: bool = False


@dataclass(frozen=True)
class Record:
    """The table of one dataclass: its fields, in the order the codecs write and read them."""

    cls: type[Any]
    fields: tuple[Field, ...]


def _label_model(seen: Seen) -> object:
    value = seen.labels.get(names.NODE_GPU_MODEL)
    return value if isinstance(value, str) else ""


def _label_vendor(seen: Seen) -> object:
    value = seen.labels.get(names.NODE_GPU_VENDOR)
    return value if isinstance(value, str) else "nvidia"


def _label_driver(seen: Seen) -> object:
    return seen.labels.get(names.NODE_GPU_DRIVER_VERSION, "")


def _minor(seen: Seen) -> object:
    return seen.values["minor"]


def _condition_reason(seen: Seen) -> object:
    """koordlet says why a GPU is unhealthy in a False condition's reason (or message)."""
    if seen.entry.get("health") is True:
        return ""
    conditions = seen.entry.get("conditions")
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("status") == "False":
            reason, message = cond.get("reason"), cond.get("message")
            return (reason if isinstance(reason, str) else "") or (message if isinstance(message, str) else "")
    return ""


NVLINK_PEER = Record(NVLinkPeer, (
    Field("bus_id", "bus_id", Extra("busID"), Kind.TEXT),
    Field("uuid", "uuid", Extra("uuid"), Kind.TEXT),
    Field("links", "links", Extra("links"), Kind.NUMBER),
))

MIG_INSTANCE = Record(MIGInstance, (
    Field("uuid", "uuid", Extra("uuid"), Kind.TEXT),
    Field("profile", "profile", Extra("profile"), Kind.TEXT),
    Field("memory_bytes", "memory_bytes", Extra("memoryBytes"), Kind.NUMBER),
    Field("slices", "slices", Extra("slices"), Kind.NUMBER),
    Field("gpu_instance_id", "gpu_instance_id", Extra("gpuInstanceID"), Kind.NUMBER),
    Field("compute_instance_id", "compute_instance_id", Extra("computeInstanceID"), Kind.NUMBER),
    Field("index", "index", Extra("index"), Kind.NUMBER),
    # Dynamic MIG (docs/mig.md): left out at their defaults, so Devices of nodes without it keep their bytes.
    Field("profile_id", "profile_id", Extra("profileID"), Kind.NUMBER, omit_default=True),
    Field("placement_start", "placement_start", Extra("placementStart"), Kind.NUMBER, omit_default=True),
    Field("placement_size", "placement_size", Extra("placementSize"), Kind.NUMBER, omit_default=True),
    Field("fgpu_created", "fgpu_created", Extra("fgpuCreated"), Kind.FLAG, omit_default=True),
))

MIG_PLACEMENT = Record(MIGPlacement, (
    Field("start", "start", Extra("start"), Kind.NUMBER),
    Field("size", "size", Extra("size"), Kind.NUMBER),
))

MIG_PROFILE = Record(MIGProfile, (
    Field("name", "name", Extra("name"), Kind.TEXT),
    Field("profile_id", "profile_id", Extra("profileID"), Kind.NUMBER),
    Field("slices", "slices", Extra("slices"), Kind.NUMBER),
    Field("memory_bytes", "memory_bytes", Extra("memoryBytes"), Kind.NUMBER),
    Field("instance_count", "instance_count", Extra("instanceCount"), Kind.NUMBER),
    Field("placements", "placements", Extra("placements"), Kind.RECORDS, records=MIG_PLACEMENT),
    Field("multiprocessors", "multiprocessors", Extra("multiprocessors"), Kind.NUMBER),
    Field("copy_engines", "copy_engines", Extra("copyEngines"), Kind.NUMBER),
    Field("decoders", "decoders", Extra("decoders"), Kind.NUMBER),
    Field("jpegs", "jpegs", Extra("jpegs"), Kind.NUMBER),
    Field("ofas", "ofas", Extra("ofas"), Kind.NUMBER),
    Field("nvml_index", "nvml_index", Extra("nvmlIndex"), Kind.NUMBER),
))

#: One GPU. Koordinator's fields come first, in the order koordlet writes them.
GPU = Record(GPUInfo, (
    # The extras of a GPU are keyed by its uuid (apis.device_object).
    Field("uuid", "uuid", Koordinator(("id",)), Kind.TEXT),
    Field("minor", "minor", Koordinator(("minor",)), Kind.MINOR),
    Field("healthy", "health", Koordinator(("health",)), Kind.HEALTH),
    Field("memory_bytes", "memory_bytes", Koordinator(("resources", names.GPU_MEMORY)), Kind.BYTES),
    Field("topology.socket_id", "topology.socket_id", Koordinator(("topology", "socketID")), Kind.NUMBER),
    Field("topology.numa_node", "topology.numa_node", Koordinator(("topology", "nodeID")), Kind.NUMBER),
    Field("topology.pcie_root", "topology.pcie_root", Koordinator(("topology", "pcieID")), Kind.TEXT),
    Field("topology.bus_id", "topology.bus_id", Koordinator(("topology", "busID")), Kind.TEXT),
    Field("index", "index", Extra("index"), Kind.NUMBER, fallback=_minor),
    Field("model", "model", Extra("model"), Kind.TEXT, fallback=_label_model),
    Field("model_label", "model_label", Extra("modelLabel"), Kind.TEXT, fallback=_label_model),
    Field("vendor", "vendor", Extra("vendor"), Kind.TEXT, fallback=_label_vendor),
    Field("health_reason", "health_reason", Extra("healthReason"), Kind.TEXT, fallback=_condition_reason),
    Field("mig_enabled", "mig_enabled", Extra("migEnabled"), Kind.FLAG),
    Field("mig_instances", "mig_instances", Extra("migInstances"), Kind.RECORDS, records=MIG_INSTANCE),
    Field("topology.nvlink_peers", "topology.nvlink_peers", Extra("nvlinkPeers"), Kind.RECORDS, records=NVLINK_PEER),
    Field("power_limit_watts", "power_limit_watts", Extra("powerLimitWatts"), Kind.NUMBER, omit_default=True),
    Field("mig_profiles", "mig_profiles", Extra("migProfiles"), Kind.RECORDS, records=MIG_PROFILE, omit_default=True),
))

EXTERNAL_HOLDER = Record(ExternalHolder, (
    Field("gpu_uuid", "gpu_uuid", Extra("gpuUUID"), Kind.TEXT),
    Field("pod_uid", "pod_uid", Extra("podUID"), Kind.TEXT),
    Field("container_name", "container_name", Extra("containerName"), Kind.TEXT),
    Field("resource_name", "resource_name", Extra("resourceName"), Kind.TEXT),
))

#: The node-wide facts. `node_name` (the object's name) and `gpus` (GPU, one entry or message
#: each) frame the report and are written by the codecs themselves.
NODE = Record(NodeDevices, (
    Field("driver_version", "driver_version", Extra("driverVersion"), Kind.TEXT, fallback=_label_driver),
    Field("cuda_driver_version", "cuda_driver_version", Extra("cudaDriverVersion"), Kind.TEXT),
    Field("discovery_error", "discovery_error", Extra("discoveryError"), Kind.TEXT),
    Field("external_holders", "external_holders", Extra("externalHolders"), Kind.RECORDS, records=EXTERNAL_HOLDER),
))

#: The fields of NodeDevices the codecs write themselves rather than from NODE.
NODE_FRAME = ("node_name", "gpus")


def value_of(obj: object, attr: str) -> Any:
    """The value at a dotted `attr` of a dataclass value: value_of(gpu, "topology.bus_id")."""
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def default_of(cls: type[Any], attr: str) -> object:
    """The dataclass default at a dotted `attr`, or `dataclasses.MISSING` when the field has none."""
    head, _, rest = attr.partition(".")
    if rest:
        return default_of(_hints(cls)[head], rest)
    found = next(f for f in dataclasses.fields(cls) if f.name == head)
    if found.default is not dataclasses.MISSING:
        return found.default
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return dataclasses.MISSING


def build(cls: type[Any], values: Mapping[str, object]) -> Any:
    """A `cls` from values by dotted attr; nested values (topology) are built from their own fields."""
    direct: dict[str, object] = {}
    nested: dict[str, dict[str, object]] = {}
    for attr, value in values.items():
        head, _, rest = attr.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = value
    hints = _hints(cls)
    for head, inner in nested.items():
        direct[head] = build(hints[head], inner)
    return cls(**direct)


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]
