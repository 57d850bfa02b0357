"""The inventory file that drives the fake NVML: a node's GPUs written as YAML.

Example (the full format is in docs/agent.md; examples/inventories/ has whole nodes):

    driverVersion: "550.54.15"
    cudaDriverVersion: "12.4"
    gpus:
      - uuid: GPU-0b7c1f4e-0000-4000-8000-000000000000
        name: NVIDIA H100 80GB HBM3
        memory: 80Gi
        busId: "00000000:18:00.0"
        numaNode: 0
        pcieRoot: pci0000:17
        nvlinks: [{remoteBusId: "00000000:05:00.0", links: 5}]
    events:
      - {gpu: 0, xid: 48, after: 2}

Every field is checked on load, and an error names the field path, the value
and the fix, so a typo in an inventory fails loudly instead of silently
describing a different machine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from apis.quantity import QuantityError, parse_quantity

#: What nvmlInit may be scripted to raise (the pynvml class name without "NVMLError_").
INIT_ERRORS = ("LibraryNotFound", "DriverNotLoaded", "NoPermission", "Unknown", "LibRmVersionMismatch")

_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_PROFILE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:\+me)?$")


class InventoryError(ValueError):
    """An inventory file that does not describe a machine."""


@dataclass(frozen=True)
class NVLinkSpec:
    remote_bus_id: str
    links: int = 1


@dataclass(frozen=True)
class MIGSpec:
    uuid: str
    profile: str
    memory_bytes: int
    slices: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class ProcessSpec:
    pid: int
    used_memory_bytes: int
    gpu_instance_id: int = 0xFFFFFFFF
    compute_instance_id: int = 0xFFFFFFFF


@dataclass(frozen=True)
class GPUSpec:
    index: int
    uuid: str
    name: str
    memory_bytes: int
    minor: int
    bus_id: str
    numa_node: int = -1
    socket_id: int = -1
    pcie_root: str = ""
    nvlinks: tuple[NVLinkSpec, ...] = ()
    #: None: the GPU has no MIG support (NVML answers NotSupported).
    mig_enabled: bool | None = None
    mig_max_devices: int = 7
    mig_instances: tuple[MIGSpec, ...] = ()
    utilization_percent: int = 0
    memory_used_bytes: int = 0
    processes: tuple[ProcessSpec, ...] = ()
    supports_events: bool = True
    lost: bool = False
    #: None: nvmlDeviceGetPowerManagementLimit raises NotSupported.
    power_limit_watts: int | None = None


@dataclass(frozen=True)
class EventSpec:
    gpu_index: int
    xid: int
    after_s: float = 0.0


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GPUSpec, ...]
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    init_error: str = ""
    events: tuple[EventSpec, ...] = ()


def load_inventory(path: str) -> Inventory:
    """Reads and checks an inventory file."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as err:
        raise InventoryError(f"inventory {path}: cannot read it ({err}); pass an existing file to --fake-nvml") from err
    except yaml.YAMLError as err:
        raise InventoryError(f"inventory {path}: not valid YAML ({err})") from err
    return parse_inventory(data, source=path)


def parse_inventory(data: object, *, source: str = "inventory") -> Inventory:
    """Checks an inventory already parsed from YAML or built in a test."""
    top = _mapping(data, source, {"driverVersion", "cudaDriverVersion", "init", "gpus", "events"})
    gpus_raw = top.get("gpus", [])
    if not isinstance(gpus_raw, Sequence) or isinstance(gpus_raw, str):
        raise InventoryError(f"{source}.gpus: {gpus_raw!r} is not a list; write a list of GPUs (may be empty)")
    gpus = tuple(_gpu(raw, index=i, where=f"{source}.gpus[{i}]") for i, raw in enumerate(gpus_raw))
    _check_unique(gpus, source)
    init = str(top.get("init", "ok"))
    if init != "ok" and init not in INIT_ERRORS:
        raise InventoryError(f"{source}.init: {init!r} is not known; write ok or one of {', '.join(INIT_ERRORS)}")
    events_raw = top.get("events", [])
    if not isinstance(events_raw, Sequence) or isinstance(events_raw, str):
        raise InventoryError(f"{source}.events: {events_raw!r} is not a list of {{gpu, xid, after}} entries")
    events = tuple(_event(raw, gpus, where=f"{source}.events[{i}]") for i, raw in enumerate(events_raw))
    return Inventory(
        gpus=gpus,
        driver_version=str(top.get("driverVersion", "550.54.15")),
        cuda_driver_version=_cuda_version(top.get("cudaDriverVersion", "12.4"), f"{source}.cudaDriverVersion"),
        init_error="" if init == "ok" else init,
        events=events,
    )


def profile_slices(profile: str) -> int | None:
    """Compute slices of a MIG profile name ("3g.40gb" -> 3), None if it is not one."""
    match = _PROFILE.match(profile)
    return int(match.group(2)) if match else None


_GPU_FIELDS = {
    "uuid", "name", "memory", "minor", "busId", "numaNode", "socketId", "pcieRoot", "nvlinks", "mig",
    "utilization", "memoryUsed", "processes", "events", "lost", "powerLimitWatts",
}


def _gpu(raw: object, *, index: int, where: str) -> GPUSpec:
    m = _mapping(raw, where, _GPU_FIELDS)
    uuid = _required_str(m, "uuid", where, example="GPU-0b7c1f4e-0000-4000-8000-000000000000")
    if not uuid.startswith("GPU-"):
        raise InventoryError(f"{where}.uuid: {uuid!r} does not start with 'GPU-'; NVML GPU UUIDs look like GPU-<uuid>")
    bus_id = _required_str(m, "busId", where, example="00000000:18:00.0")
    if not _BUS_ID.match(bus_id):
        raise InventoryError(f"{where}.busId: {bus_id!r} is not a PCI bus id; write it as 00000000:18:00.0")
    memory = _bytes(m.get("memory"), f"{where}.memory")
    if memory <= 0:
        raise InventoryError(f"{where}.memory: {m.get('memory')!r} must be positive, e.g. 80Gi")
    numa = _int(m.get("numaNode", -1), f"{where}.numaNode")
    mig_enabled, max_devices, instances = _mig(m.get("mig"), f"{where}.mig", memory)
    return GPUSpec(
        index=index,
        uuid=uuid,
        name=_required_str(m, "name", where, example="NVIDIA A100-SXM4-80GB"),
        memory_bytes=memory,
        minor=_int(m.get("minor", index), f"{where}.minor"),
        bus_id=_nvml_bus_id(bus_id),
        numa_node=numa,
        socket_id=_int(m.get("socketId", numa), f"{where}.socketId"),
        pcie_root=str(m.get("pcieRoot", "")),
        nvlinks=tuple(_nvlink(raw_link, f"{where}.nvlinks[{i}]") for i, raw_link in enumerate(_list(m, "nvlinks", where))),
        mig_enabled=mig_enabled,
        mig_max_devices=max_devices,
        mig_instances=instances,
        utilization_percent=_percent(m.get("utilization", 0), f"{where}.utilization"),
        memory_used_bytes=_bytes(m.get("memoryUsed", 0), f"{where}.memoryUsed"),
        processes=tuple(_process(p, f"{where}.processes[{i}]") for i, p in enumerate(_list(m, "processes", where))),
        supports_events=_bool(m.get("events", True), f"{where}.events"),
        lost=_bool(m.get("lost", False), f"{where}.lost"),
        power_limit_watts=_watts(m.get("powerLimitWatts"), f"{where}.powerLimitWatts"),
    )


def _mig(raw: object, where: str, gpu_memory: int) -> tuple[bool | None, int, tuple[MIGSpec, ...]]:
    if raw is None:
        return None, 7, ()
    m = _mapping(raw, where, {"mode", "maxDevices", "instances"})
    mode = str(m.get("mode", "enabled"))
    if mode not in ("enabled", "disabled"):
        raise InventoryError(f"{where}.mode: {mode!r} is not known; write enabled or disabled")
    max_devices = _int(m.get("maxDevices", 7), f"{where}.maxDevices")
    instances: list[MIGSpec] = []
    for i, item in enumerate(_list(m, "instances", where)):
        iw = f"{where}.instances[{i}]"
        im = _mapping(item, iw, {"uuid", "profile", "memory", "slices", "gpuInstanceId", "computeInstanceId"})
        uuid = _required_str(im, "uuid", iw, example="MIG-5c1a0000-0000-4000-8000-000000000001")
        if not uuid.startswith("MIG-"):
            raise InventoryError(f"{iw}.uuid: {uuid!r} does not start with 'MIG-'; MIG UUIDs look like MIG-<uuid>")
        profile = _required_str(im, "profile", iw, example="1g.10gb")
        slices = profile_slices(profile)
        if slices is None:
            raise InventoryError(f"{iw}.profile: {profile!r} is not a MIG profile; write it as NVIDIA does, e.g. 1g.10gb")
        memory = _bytes(im.get("memory", f"{int(profile.split('.')[-1].removesuffix('gb').removesuffix('+me'))}Gi"), f"{iw}.memory")
        if memory > gpu_memory:
            raise InventoryError(f"{iw}.memory: {memory} bytes is more than the GPU's {gpu_memory}; lower it")
        instances.append(
            MIGSpec(
                uuid=uuid,
                profile=profile,
                memory_bytes=memory,
                slices=_int(im.get("slices", slices), f"{iw}.slices"),
                gpu_instance_id=_int(im.get("gpuInstanceId", i + 1), f"{iw}.gpuInstanceId"),
                compute_instance_id=_int(im.get("computeInstanceId", 0), f"{iw}.computeInstanceId"),
            )
        )
    if mode == "disabled" and instances:
        raise InventoryError(f"{where}: mode is disabled but instances are listed; set mode: enabled or drop them")
    if len(instances) > max_devices:
        raise InventoryError(f"{where}.instances: {len(instances)} instances exceed maxDevices={max_devices}")
    return mode == "enabled", max_devices, tuple(instances)


def _nvlink(raw: object, where: str) -> NVLinkSpec:
    if isinstance(raw, str):
        raw = {"remoteBusId": raw}
    m = _mapping(raw, where, {"remoteBusId", "links"})
    remote = _required_str(m, "remoteBusId", where, example="00000000:2A:00.0")
    if not _BUS_ID.match(remote):
        raise InventoryError(f"{where}.remoteBusId: {remote!r} is not a PCI bus id; write it as 00000000:2A:00.0")
    links = _int(m.get("links", 1), f"{where}.links")
    if links < 1:
        raise InventoryError(f"{where}.links: {links} must be at least 1")
    return NVLinkSpec(remote_bus_id=_nvml_bus_id(remote), links=links)


def _nvml_bus_id(bus_id: str) -> str:
    """NVML spells the 8-digit-domain form in upper case."""
    return bus_id.upper() if len(bus_id.split(":")[0]) == 8 else bus_id


def _process(raw: object, where: str) -> ProcessSpec:
    m = _mapping(raw, where, {"pid", "usedMemory", "gpuInstanceId", "computeInstanceId"})
    pid = _int(m.get("pid"), f"{where}.pid")
    if pid <= 0:
        raise InventoryError(f"{where}.pid: {pid} must be a positive process id")
    return ProcessSpec(
        pid=pid,
        used_memory_bytes=_bytes(m.get("usedMemory", 0), f"{where}.usedMemory"),
        gpu_instance_id=_int(m.get("gpuInstanceId", 0xFFFFFFFF), f"{where}.gpuInstanceId"),
        compute_instance_id=_int(m.get("computeInstanceId", 0xFFFFFFFF), f"{where}.computeInstanceId"),
    )


def _event(raw: object, gpus: tuple[GPUSpec, ...], *, where: str) -> EventSpec:
    m = _mapping(raw, where, {"gpu", "xid", "after"})
    target = m.get("gpu")
    index: int | None = None
    if isinstance(target, int) and not isinstance(target, bool) and 0 <= target < len(gpus):
        index = target
    elif isinstance(target, str):
        index = next((g.index for g in gpus if g.uuid == target), None)
    if index is None:
        raise InventoryError(f"{where}.gpu: {target!r} names no GPU; write an index 0..{len(gpus) - 1} or a listed UUID")
    after = m.get("after", 0)
    if isinstance(after, str) and after.endswith("s"):
        after = after[:-1]
    try:
        after_s = float(after)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InventoryError(f"{where}.after: {m.get('after')!r} is not a duration; write seconds such as 2 or 2.5s") from None
    return EventSpec(gpu_index=index, xid=_int(m.get("xid"), f"{where}.xid"), after_s=after_s)


def _check_unique(gpus: tuple[GPUSpec, ...], source: str) -> None:
    for attr, label in (("uuid", "uuid"), ("minor", "minor"), ("bus_id", "busId")):
        seen: dict[object, int] = {}
        for g in gpus:
            value = getattr(g, attr)
            if value in seen:
                raise InventoryError(
                    f"{source}.gpus[{g.index}].{label}: {value!r} is also used by gpus[{seen[value]}]; each GPU needs its own"
                )
            seen[value] = g.index


def _mapping(raw: object, where: str, known: set[str]) -> Mapping[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InventoryError(f"{where}: {raw!r} is not a mapping; write key: value fields")
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise InventoryError(f"{where}: unknown field {unknown[0]!r}; known fields are {', '.join(sorted(known))}")
    return raw


def _list(m: Mapping[str, Any], key: str, where: str) -> Sequence[object]:
    value = m.get(key, [])
    if value is None:
        return []
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise InventoryError(f"{where}.{key}: {value!r} is not a list")
    return value


def _required_str(m: Mapping[str, Any], key: str, where: str, *, example: str) -> str:
    value = m.get(key)
    if not isinstance(value, str) or not value:
        raise InventoryError(f"{where}.{key}: {value!r} is missing or not text; write e.g. {key}: {example!r}")
    return value


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InventoryError(f"{where}: {value!r} is not a whole number")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise InventoryError(f"{where}: {value!r} is not true or false")
    return value


def _percent(value: object, where: str) -> int:
    n = _int(value, where)
    if not 0 <= n <= 100:
        raise InventoryError(f"{where}: {n} is not a percentage; write 0..100")
    return n


def _watts(value: object, where: str) -> int | None:
    if value is None:
        return None
    n = _int(value, where)
    if n <= 0:
        raise InventoryError(f"{where}: {n} is not a power limit; write whole watts such as 700, or leave it out")
    return n


def _bytes(value: object, where: str) -> int:
    if value is None:
        raise InventoryError(f"{where}: missing; write bytes or a quantity such as 80Gi")
    try:
        q = parse_quantity(value, field=where)
    except QuantityError as err:
        raise InventoryError(f"{err}; write bytes or a quantity such as 80Gi") from None
    if q.denominator != 1 or q < 0:
        raise InventoryError(f"{where}: {value!r} is not a whole, non-negative number of bytes")
    return int(q)


def _cuda_version(value: object, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.match(r"^(\d+)\.(\d+)$", str(value))
    if match is None:
        raise InventoryError(f"{where}: {value!r} is not a CUDA version; write it as 12.4 (or NVML's 12040)")
    return int(match.group(1)) * 1000 + int(match.group(2)) * 10
