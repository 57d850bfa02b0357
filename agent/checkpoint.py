"""GPUs kubelet gave to pods through another device plugin, from its checkpoint file.

kubelet's device manager keeps /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint:

    {"Data": {"PodDeviceEntries": [{"PodUID": "6f1c...", "ContainerName": "main",
       "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"-1": ["GPU-8f2b..."]},
       "AllocResp": "..."}], "RegisteredDevices": {"nvidia.com/gpu": ["GPU-8f2b..."]}},
     "Checksum": 1234567}

`DeviceIDs` is keyed by NUMA node since Kubernetes 1.20 and a plain list
before. The NVIDIA device plugin names devices by UUID, by UUID plus a
"::N" replica suffix when time-slicing, by MIG UUID, or by index. Whatever
the form, the GPU is held by someone who is not fgpu, so fgpu's scheduler
must treat it as full.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from apis.devices import ExternalHolder, NodeDevices

log = logging.getLogger(__name__)

DEFAULT_PATH = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read as kubelet writes it."""


@dataclass(frozen=True)
class CheckpointEntry:
    pod_uid: str
    container_name: str
    resource_name: str
    device_ids: tuple[str, ...]


def parse_checkpoint(text: str, *, source: str = "checkpoint") -> tuple[CheckpointEntry, ...]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{source}: not JSON ({err}); is it a kubelet device-manager checkpoint?") from None
    body = data.get("Data") if isinstance(data, dict) else None
    if not isinstance(body, dict):
        raise CheckpointError(f"{source}: no Data object; expected kubelet's {{\"Data\": {{\"PodDeviceEntries\": ...}}}}")
    raw_entries = body.get("PodDeviceEntries")
    if raw_entries is None:
        raw_entries = []
    if not isinstance(raw_entries, list):
        raise CheckpointError(f"{source}: Data.PodDeviceEntries is {type(raw_entries).__name__}, expected a list")
    entries = []
    for i, raw in enumerate(raw_entries):
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: Data.PodDeviceEntries[{i}] is not an object")
        entries.append(
            CheckpointEntry(
                pod_uid=str(raw.get("PodUID", "")),
                container_name=str(raw.get("ContainerName", "")),
                resource_name=str(raw.get("ResourceName", "")),
                device_ids=_device_ids(raw.get("DeviceIDs"), where=f"{source}: Data.PodDeviceEntries[{i}].DeviceIDs"),
            )
        )
    return tuple(entries)


def read_checkpoint(path: str = DEFAULT_PATH) -> tuple[CheckpointEntry, ...]:
    """The entries of the file at `path`; none when it does not exist (no device plugin ever ran)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return ()
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read it ({err}); check the agent's mount of kubelet's directory") from err
    return parse_checkpoint(text, source=path)


def external_holders(
    entries: Iterable[CheckpointEntry], *, devices: NodeDevices, resource_names: Iterable[str]
) -> tuple[ExternalHolder, ...]:
    """The GPUs of `devices` that `entries` hand out under one of `resource_names`.

    A resource name ending in "*" matches by prefix (e.g. "nvidia.com/mig-*").
    """
    exact = {r for r in resource_names if not r.endswith("*")}
    prefixes = tuple(r[:-1] for r in resource_names if r.endswith("*"))
    by_id: dict[str, str] = {}
    for g in devices.gpus:
        by_id[g.uuid] = g.uuid
        by_id[str(g.index)] = g.uuid
        for m in g.mig_instances:
            by_id[m.uuid] = g.uuid
    holders: list[ExternalHolder] = []
    seen: set[tuple[str, str, str]] = set()
    for e in entries:
        if e.resource_name not in exact and not e.resource_name.startswith(prefixes):
            continue
        for device_id in e.device_ids:
            uuid = by_id.get(device_id.split("::", 1)[0])
            if uuid is None:
                log.debug("checkpoint: %s device %r is not a GPU here", e.resource_name, device_id)
                continue
            key = (uuid, e.pod_uid, e.container_name)
            if key in seen:
                continue
            seen.add(key)
            holders.append(
                ExternalHolder(gpu_uuid=uuid, pod_uid=e.pod_uid, container_name=e.container_name, resource_name=e.resource_name)
            )
    return tuple(holders)


class CheckpointReader:
    """Re-reads the checkpoint only when its modification time or size changed."""

    def __init__(self, path: str = DEFAULT_PATH) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._entries: tuple[CheckpointEntry, ...] = ()

    def entries(self) -> tuple[CheckpointEntry, ...]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._entries = None, ()
            return ()
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self._entries = read_checkpoint(self.path)
            except CheckpointError as err:
                # Keep the last good answer: a half-written file must not free GPUs pods still hold.
                log.warning("%s", err)
                return self._entries
            self._stamp = stamp
        return self._entries


def _device_ids(raw: object, *, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, list):
        return tuple(str(d) for d in raw)
    if isinstance(raw, dict):
        ids: list[str] = []
        for numa in sorted(raw, key=str):
            value = raw[numa]
            if not isinstance(value, list):
                raise CheckpointError(f"{where}[{numa!r}] is {type(value).__name__}, expected a list of device ids")
            ids.extend(str(d) for d in value)
        return tuple(ids)
    raise CheckpointError(f"{where} is {type(raw).__name__}, expected a list or a NUMA-node map of lists")
