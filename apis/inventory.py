"""A node's GPU inventory as plain values: its GPUs, their topology and MIG instances.

The agent discovers a `NodeDevices` through NVML; the scheduler reads one back
from either wire form (apis/device_report.py, apis/device_object.py), so both
state backends feed it identical data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from apis.mig import MIGProfile

#: Kubernetes caps a label value at 63 characters.
LABEL_VALUE_MAX = 63
_MODEL_PREFIXES = ("NVIDIA ", "Tesla ")


@dataclass(frozen=True)
class NVLinkPeer:
    bus_id: str
    uuid: str = ""
    links: int = 1


@dataclass(frozen=True)
class Topology:
    numa_node: int = -1
    socket_id: int = -1
    pcie_root: str = ""
    bus_id: str = ""
    nvlink_peers: tuple[NVLinkPeer, ...] = ()


@dataclass(frozen=True)
class MIGInstance:
    uuid: str
    profile: str
    memory_bytes: int
    slices: int
    gpu_instance_id: int = 0
    compute_instance_id: int = 0
    index: int = 0
    #: NVML profile id of its GPU instance (-1: not read, e.g. an agent before dynamic MIG).
    profile_id: int = -1
    #: Its GPU instance's placement in memory slices (start -1: not known; apis/mig.py).
    placement_start: int = -1
    placement_size: int = 0
    #: fgpu created it for a pod (agent/mig_manager.py decides); False: an operator's, never destroyed by fgpu.
    fgpu_created: bool = False


@dataclass(frozen=True)
class GPUInfo:
    """One physical GPU; see `fgpu.v1.GPU` in proto/fgpu/v1/device.proto for each field.

    Where each field travels in the report and the Device object: apis/device_fields.py.
    """

    uuid: str
    minor: int
    index: int
    model: str
    model_label: str
    memory_bytes: int
    healthy: bool = True
    health_reason: str = ""
    topology: Topology = field(default_factory=Topology)
    vendor: str = "nvidia"
    mig_enabled: bool = False
    mig_instances: tuple[MIGInstance, ...] = ()
    power_limit_watts: int = 0
    #: GPU instance profiles NVML offers on a MIG-capable GPU, with their legal placements; () otherwise.
    mig_profiles: tuple[MIGProfile, ...] = ()


@dataclass(frozen=True)
class ExternalHolder:
    gpu_uuid: str
    pod_uid: str = ""
    container_name: str = ""
    resource_name: str = ""


@dataclass(frozen=True)
class NodeDevices:
    """Everything known about one node's GPUs; see `fgpu.v1.NodeDeviceReport`."""

    node_name: str
    gpus: tuple[GPUInfo, ...] = ()
    driver_version: str = ""
    cuda_driver_version: str = ""
    external_holders: tuple[ExternalHolder, ...] = ()
    discovery_error: str = ""


def model_label(nvml_name: str) -> str:
    """Label-safe model name: "NVIDIA A100-SXM4-80GB" -> "A100-SXM4-80GB", "Tesla T4" -> "T4"."""
    name = nvml_name.strip()
    stripped = True
    while stripped:
        stripped = False
        for prefix in _MODEL_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):].lstrip()
                stripped = True
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name)
    name = name[:LABEL_VALUE_MAX]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", name)
