"""What the node and its Device object should say, and whether they say it already.

Pure: from `NodeDevices` to the desired Device object, node labels and node
extended resources, and comparisons against what the API server holds. The
writer (`agent.node_report_writer`) does the I/O and writes only when these say so.

Extended resources are counted from healthy GPUs that no other device plugin
holds, so kube-scheduler's own resource fit never counts a GPU fgpu cannot
hand out:

    koordinator.sh/gpu-core          100 per GPU
    koordinator.sh/gpu-memory        the GPUs' memory, in bytes
    koordinator.sh/gpu-memory-ratio  100 per GPU
    koordinator.sh/gpu.shared        100 per GPU (as koordlet reports it)
    nvidia.com/gpu                   1 per GPU, only when configured to advertise it
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from apis import names
from apis.devices import NodeDevices, to_device_object
from apis.quantity import QuantityError, format_bytes, parse_quantity


def node_resources(devices: NodeDevices, *, advertise_nvidia_gpu: bool) -> dict[str, str]:
    held = {h.gpu_uuid for h in devices.external_holders}
    usable = [g for g in devices.gpus if g.healthy and g.uuid not in held]
    resources = {
        names.GPU_CORE: str(100 * len(usable)),
        names.GPU_MEMORY: format_bytes(sum(g.memory_bytes for g in usable)),
        names.GPU_MEMORY_RATIO: str(100 * len(usable)),
        names.GPU_SHARED: str(100 * len(usable)),
    }
    if advertise_nvidia_gpu:
        resources[names.NVIDIA_GPU] = str(len(usable))
    return resources


def node_labels(devices: NodeDevices) -> dict[str, str]:
    """The GPU labels; empty when no GPU was found (existing labels are then left alone)."""
    if not devices.gpus:
        return {}
    # A mixed node gets the label of its most common model: one label value cannot name two.
    model = Counter(g.model_label for g in devices.gpus if g.model_label).most_common(1)
    labels = {names.NODE_GPU_VENDOR: devices.gpus[0].vendor}
    if model:
        labels[names.NODE_GPU_MODEL] = model[0][0]
    if devices.driver_version:
        labels[names.NODE_GPU_DRIVER_VERSION] = devices.driver_version
    return labels


def node_status_patch(node: Mapping[str, Any] | None, desired: Mapping[str, str]) -> dict[str, Any] | None:
    """The status patch that makes `node` carry `desired` in capacity and allocatable; None when it does.

    Only the names in `desired` are touched: nvidia.com/gpu, when not
    advertised by fgpu, belongs to the NVIDIA device plugin.
    """
    status = (node or {}).get("status") or {}
    for section in ("capacity", "allocatable"):
        current = status.get(section) or {}
        if any(current.get(name) is None or not _same_quantity(current[name], want) for name, want in desired.items()):
            return {"capacity": dict(desired), "allocatable": dict(desired)}
    return None


def node_labels_patch(node: Mapping[str, Any] | None, desired: Mapping[str, str]) -> dict[str, str | None] | None:
    current = ((node or {}).get("metadata") or {}).get("labels") or {}
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    return patch or None


def desired_device(devices: NodeDevices, *, node_uid: str | None) -> dict[str, Any]:
    return to_device_object(devices, node_uid=node_uid)


def device_differs(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """True when `current` (from the server) does not say what `desired` says.

    Labels and annotations others added are kept and do not count; spec,
    fgpu's own labels and annotations and the owner do.
    """
    if (current.get("spec") or {}) != (desired.get("spec") or {}):
        return True
    cur_meta = current.get("metadata") or {}
    want_meta = desired.get("metadata") or {}
    for key in ("labels", "annotations"):
        have = cur_meta.get(key) or {}
        if any(have.get(k) != v for k, v in (want_meta.get(key) or {}).items()):
            return True
    want_owner = want_meta.get("ownerReferences") or []
    have_owner = cur_meta.get("ownerReferences") or []
    return bool(want_owner) and [_owner_key(o) for o in have_owner] != [_owner_key(o) for o in want_owner]


def merged_device(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` written over `current`, keeping others' labels/annotations and the resourceVersion."""
    cur_meta = current.get("metadata") or {}
    want_meta = desired.get("metadata") or {}
    metadata = dict(want_meta)
    for key in ("labels", "annotations"):
        metadata[key] = {**(cur_meta.get(key) or {}), **(want_meta.get(key) or {})}
    if "resourceVersion" in cur_meta:
        metadata["resourceVersion"] = cur_meta["resourceVersion"]
    if not want_meta.get("ownerReferences") and cur_meta.get("ownerReferences"):
        metadata["ownerReferences"] = cur_meta["ownerReferences"]
    out = dict(desired)
    out["metadata"] = metadata
    if "status" in current:
        out["status"] = current["status"]
    return out


def _owner_key(ref: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(ref.get("kind", "")), str(ref.get("name", "")), str(ref.get("uid", "")))


def _same_quantity(a: object, b: object) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except QuantityError:
        return a == b
