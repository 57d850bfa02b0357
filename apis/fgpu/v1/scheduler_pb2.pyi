from apis.fgpu.v1 import device_pb2 as _device_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Container(_message.Message):
    __slots__ = ("name", "requests", "limits", "init")
    class RequestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LimitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    INIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    requests: _containers.ScalarMap[str, str]
    limits: _containers.ScalarMap[str, str]
    init: bool
    def __init__(self, name: _Optional[str] = ..., requests: _Optional[_Mapping[str, str]] = ..., limits: _Optional[_Mapping[str, str]] = ..., init: _Optional[bool] = ...) -> None: ...

class Pod(_message.Message):
    __slots__ = ("namespace", "name", "uid", "labels", "annotations", "containers", "manifest_json")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    uid: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    containers: _containers.RepeatedCompositeFieldContainer[Container]
    manifest_json: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., containers: _Optional[_Iterable[_Union[Container, _Mapping]]] = ..., manifest_json: _Optional[str] = ...) -> None: ...

class FilterRequest(_message.Message):
    __slots__ = ("pod", "node_names")
    POD_FIELD_NUMBER: _ClassVar[int]
    NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    pod: Pod
    node_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pod: _Optional[_Union[Pod, _Mapping]] = ..., node_names: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeVerdict(_message.Message):
    __slots__ = ("node_name", "feasible", "reason", "unresolvable")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    FEASIBLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    UNRESOLVABLE_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    feasible: bool
    reason: str
    unresolvable: bool
    def __init__(self, node_name: _Optional[str] = ..., feasible: _Optional[bool] = ..., reason: _Optional[str] = ..., unresolvable: _Optional[bool] = ...) -> None: ...

class FilterResponse(_message.Message):
    __slots__ = ("verdicts", "pod_error")
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    POD_ERROR_FIELD_NUMBER: _ClassVar[int]
    verdicts: _containers.RepeatedCompositeFieldContainer[NodeVerdict]
    pod_error: str
    def __init__(self, verdicts: _Optional[_Iterable[_Union[NodeVerdict, _Mapping]]] = ..., pod_error: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("pod", "node_names")
    POD_FIELD_NUMBER: _ClassVar[int]
    NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    pod: Pod
    node_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pod: _Optional[_Union[Pod, _Mapping]] = ..., node_names: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeScore(_message.Message):
    __slots__ = ("node_name", "score")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    score: int
    def __init__(self, node_name: _Optional[str] = ..., score: _Optional[int] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores",)
    SCORES_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[NodeScore]
    def __init__(self, scores: _Optional[_Iterable[_Union[NodeScore, _Mapping]]] = ...) -> None: ...

class GPUAllocation(_message.Message):
    __slots__ = ("minor", "uuid", "core_percent", "memory_bytes", "memory_ratio_percent", "mig_uuid")
    MINOR_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    CORE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_RATIO_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MIG_UUID_FIELD_NUMBER: _ClassVar[int]
    minor: int
    uuid: str
    core_percent: int
    memory_bytes: int
    memory_ratio_percent: int
    mig_uuid: str
    def __init__(self, minor: _Optional[int] = ..., uuid: _Optional[str] = ..., core_percent: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., memory_ratio_percent: _Optional[int] = ..., mig_uuid: _Optional[str] = ...) -> None: ...

class NodeAllocation(_message.Message):
    __slots__ = ("node_name", "gpus")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    gpus: _containers.RepeatedCompositeFieldContainer[GPUAllocation]
    def __init__(self, node_name: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GPUAllocation, _Mapping]]] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("pod", "node_name")
    POD_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    pod: Pod
    node_name: str
    def __init__(self, pod: _Optional[_Union[Pod, _Mapping]] = ..., node_name: _Optional[str] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("allocation",)
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    allocation: NodeAllocation
    def __init__(self, allocation: _Optional[_Union[NodeAllocation, _Mapping]] = ...) -> None: ...

class UnreserveRequest(_message.Message):
    __slots__ = ("pod", "node_name")
    POD_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    pod: Pod
    node_name: str
    def __init__(self, pod: _Optional[_Union[Pod, _Mapping]] = ..., node_name: _Optional[str] = ...) -> None: ...

class UnreserveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BindRequest(_message.Message):
    __slots__ = ("pod", "node_name")
    POD_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    pod: Pod
    node_name: str
    def __init__(self, pod: _Optional[_Union[Pod, _Mapping]] = ..., node_name: _Optional[str] = ...) -> None: ...

class BindResponse(_message.Message):
    __slots__ = ("allocation",)
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    allocation: NodeAllocation
    def __init__(self, allocation: _Optional[_Union[NodeAllocation, _Mapping]] = ...) -> None: ...

class ReportDevicesRequest(_message.Message):
    __slots__ = ("report",)
    REPORT_FIELD_NUMBER: _ClassVar[int]
    report: _device_pb2.NodeDeviceReport
    def __init__(self, report: _Optional[_Union[_device_pb2.NodeDeviceReport, _Mapping]] = ...) -> None: ...

class ReportDevicesResponse(_message.Message):
    __slots__ = ("orphaned_allocations",)
    ORPHANED_ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    orphaned_allocations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, orphaned_allocations: _Optional[_Iterable[str]] = ...) -> None: ...

class GetNodeStateRequest(_message.Message):
    __slots__ = ("node_names",)
    NODE_NAMES_FIELD_NUMBER: _ClassVar[int]
    node_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_names: _Optional[_Iterable[str]] = ...) -> None: ...

class PodShare(_message.Message):
    __slots__ = ("namespace", "name", "uid", "core_percent", "memory_bytes", "assumed")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    CORE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ASSUMED_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    uid: str
    core_percent: int
    memory_bytes: int
    assumed: bool
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ..., core_percent: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., assumed: _Optional[bool] = ...) -> None: ...

class GPUState(_message.Message):
    __slots__ = ("device", "allocated_core_percent", "allocated_memory_bytes", "pods", "held_externally")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_CORE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    HELD_EXTERNALLY_FIELD_NUMBER: _ClassVar[int]
    device: _device_pb2.GPU
    allocated_core_percent: int
    allocated_memory_bytes: int
    pods: _containers.RepeatedCompositeFieldContainer[PodShare]
    held_externally: bool
    def __init__(self, device: _Optional[_Union[_device_pb2.GPU, _Mapping]] = ..., allocated_core_percent: _Optional[int] = ..., allocated_memory_bytes: _Optional[int] = ..., pods: _Optional[_Iterable[_Union[PodShare, _Mapping]]] = ..., held_externally: _Optional[bool] = ...) -> None: ...

class NodeState(_message.Message):
    __slots__ = ("node_name", "gpus", "driver_version", "discovery_error")
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_ERROR_FIELD_NUMBER: _ClassVar[int]
    node_name: str
    gpus: _containers.RepeatedCompositeFieldContainer[GPUState]
    driver_version: str
    discovery_error: str
    def __init__(self, node_name: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GPUState, _Mapping]]] = ..., driver_version: _Optional[str] = ..., discovery_error: _Optional[str] = ...) -> None: ...

class GetNodeStateResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeState]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeState, _Mapping]]] = ...) -> None: ...
