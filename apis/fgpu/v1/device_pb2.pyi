import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Health(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTH_UNSPECIFIED: _ClassVar[Health]
    HEALTHY: _ClassVar[Health]
    UNHEALTHY: _ClassVar[Health]
HEALTH_UNSPECIFIED: Health
HEALTHY: Health
UNHEALTHY: Health

class NVLinkPeer(_message.Message):
    __slots__ = ("bus_id", "uuid", "links")
    BUS_ID_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    bus_id: str
    uuid: str
    links: int
    def __init__(self, bus_id: _Optional[str] = ..., uuid: _Optional[str] = ..., links: _Optional[int] = ...) -> None: ...

class Topology(_message.Message):
    __slots__ = ("numa_node", "socket_id", "pcie_root", "bus_id", "nvlink_peers")
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    SOCKET_ID_FIELD_NUMBER: _ClassVar[int]
    PCIE_ROOT_FIELD_NUMBER: _ClassVar[int]
    BUS_ID_FIELD_NUMBER: _ClassVar[int]
    NVLINK_PEERS_FIELD_NUMBER: _ClassVar[int]
    numa_node: int
    socket_id: int
    pcie_root: str
    bus_id: str
    nvlink_peers: _containers.RepeatedCompositeFieldContainer[NVLinkPeer]
    def __init__(self, numa_node: _Optional[int] = ..., socket_id: _Optional[int] = ..., pcie_root: _Optional[str] = ..., bus_id: _Optional[str] = ..., nvlink_peers: _Optional[_Iterable[_Union[NVLinkPeer, _Mapping]]] = ...) -> None: ...

class MIGInstance(_message.Message):
    __slots__ = ("uuid", "profile", "memory_bytes", "slices", "gpu_instance_id", "compute_instance_id", "index", "profile_id", "placement_start", "placement_size", "fgpu_created")
    UUID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_START_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_SIZE_FIELD_NUMBER: _ClassVar[int]
    FGPU_CREATED_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    profile: str
    memory_bytes: int
    slices: int
    gpu_instance_id: int
    compute_instance_id: int
    index: int
    profile_id: int
    placement_start: int
    placement_size: int
    fgpu_created: bool
    def __init__(self, uuid: _Optional[str] = ..., profile: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., slices: _Optional[int] = ..., gpu_instance_id: _Optional[int] = ..., compute_instance_id: _Optional[int] = ..., index: _Optional[int] = ..., profile_id: _Optional[int] = ..., placement_start: _Optional[int] = ..., placement_size: _Optional[int] = ..., fgpu_created: _Optional[bool] = ...) -> None: ...

class MIGPlacement(_message.Message):
    __slots__ = ("start", "size")
    START_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    start: int
    size: int
    def __init__(self, start: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class MIGProfile(_message.Message):
    __slots__ = ("name", "profile_id", "slices", "memory_bytes", "instance_count", "placements", "multiprocessors", "copy_engines", "decoders", "jpegs", "ofas", "nvml_index")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROFILE_ID_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    MULTIPROCESSORS_FIELD_NUMBER: _ClassVar[int]
    COPY_ENGINES_FIELD_NUMBER: _ClassVar[int]
    DECODERS_FIELD_NUMBER: _ClassVar[int]
    JPEGS_FIELD_NUMBER: _ClassVar[int]
    OFAS_FIELD_NUMBER: _ClassVar[int]
    NVML_INDEX_FIELD_NUMBER: _ClassVar[int]
    name: str
    profile_id: int
    slices: int
    memory_bytes: int
    instance_count: int
    placements: _containers.RepeatedCompositeFieldContainer[MIGPlacement]
    multiprocessors: int
    copy_engines: int
    decoders: int
    jpegs: int
    ofas: int
    nvml_index: int
    def __init__(self, name: _Optional[str] = ..., profile_id: _Optional[int] = ..., slices: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., instance_count: _Optional[int] = ..., placements: _Optional[_Iterable[_Union[MIGPlacement, _Mapping]]] = ..., multiprocessors: _Optional[int] = ..., copy_engines: _Optional[int] = ..., decoders: _Optional[int] = ..., jpegs: _Optional[int] = ..., ofas: _Optional[int] = ..., nvml_index: _Optional[int] = ...) -> None: ...

class GPU(_message.Message):
    __slots__ = ("uuid", "minor", "index", "vendor", "model", "model_label", "memory_bytes", "health", "health_reason", "topology", "mig_enabled", "mig_instances", "power_limit_watts", "mig_profiles")
    UUID_FIELD_NUMBER: _ClassVar[int]
    MINOR_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_LABEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    MIG_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_WATTS_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILES_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    minor: int
    index: int
    vendor: str
    model: str
    model_label: str
    memory_bytes: int
    health: Health
    health_reason: str
    topology: Topology
    mig_enabled: bool
    mig_instances: _containers.RepeatedCompositeFieldContainer[MIGInstance]
    power_limit_watts: int
    mig_profiles: _containers.RepeatedCompositeFieldContainer[MIGProfile]
    def __init__(self, uuid: _Optional[str] = ..., minor: _Optional[int] = ..., index: _Optional[int] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ..., model_label: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., health: _Optional[_Union[Health, str]] = ..., health_reason: _Optional[str] = ..., topology: _Optional[_Union[Topology, _Mapping]] = ..., mig_enabled: _Optional[bool] = ..., mig_instances: _Optional[_Iterable[_Union[MIGInstance, _Mapping]]] = ..., power_limit_watts: _Optional[int] = ..., mig_profiles: _Optional[_Iterable[_Union[MIGProfile, _Mapping]]] = ...) -> None: ...

class ProcessUsage(_message.Message):
    __slots__ = ("pid", "pod_uid", "container_id", "used_memory_bytes")
    PID_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    pid: int
    pod_uid: str
    container_id: str
    used_memory_bytes: int
    def __init__(self, pid: _Optional[int] = ..., pod_uid: _Optional[str] = ..., container_id: _Optional[str] = ..., used_memory_bytes: _Optional[int] = ...) -> None: ...

class GPUUsage(_message.Message):
    __slots__ = ("uuid", "sm_utilization_percent", "memory_used_bytes", "processes")
    UUID_FIELD_NUMBER: _ClassVar[int]
    SM_UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    sm_utilization_percent: int
    memory_used_bytes: int
    processes: _containers.RepeatedCompositeFieldContainer[ProcessUsage]
    def __init__(self, uuid: _Optional[str] = ..., sm_utilization_percent: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., processes: _Optional[_Iterable[_Union[ProcessUsage, _Mapping]]] = ...) -> None: ...

class ExternalHolder(_message.Message):
    __slots__ = ("gpu_uuid", "pod_uid", "container_name", "resource_name")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    pod_uid: str
    container_name: str
    resource_name: str
    def __init__(self, gpu_uuid: _Optional[str] = ..., pod_uid: _Optional[str] = ..., container_name: _Optional[str] = ..., resource_name: _Optional[str] = ...) -> None: ...

class NodeDeviceReport(_message.Message):
    __slots__ = ("node_name", "gpus", "driver_version", "cuda_driver_version", "external_holders", "discovery_error", "observed_at", "usage")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_ERROR_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    gpus: _containers.RepeatedCompositeFieldContainer[GPU]
    driver_version: str
    cuda_driver_version: str
    external_holders: _containers.RepeatedCompositeFieldContainer[ExternalHolder]
    discovery_error: str
    observed_at: _timestamp_pb2.Timestamp
    usage: _containers.RepeatedCompositeFieldContainer[GPUUsage]
    def __init__(self, node_name: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GPU, _Mapping]]] = ..., driver_version: _Optional[str] = ..., cuda_driver_version: _Optional[str] = ..., external_holders: _Optional[_Iterable[_Union[ExternalHolder, _Mapping]]] = ..., discovery_error: _Optional[str] = ..., observed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., usage: _Optional[_Iterable[_Union[GPUUsage, _Mapping]]] = ...) -> None: ...
