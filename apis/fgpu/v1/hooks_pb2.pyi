from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MountPropagation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROPAGATION_PRIVATE: _ClassVar[MountPropagation]
    PROPAGATION_HOST_TO_CONTAINER: _ClassVar[MountPropagation]
    PROPAGATION_BIDIRECTIONAL: _ClassVar[MountPropagation]
PROPAGATION_PRIVATE: MountPropagation
PROPAGATION_HOST_TO_CONTAINER: MountPropagation
PROPAGATION_BIDIRECTIONAL: MountPropagation

class PodSandboxMeta(_message.Message):
    __slots__ = ("name", "namespace", "uid", "attempt", "labels", "annotations", "sandbox_id", "cgroup_parent", "runtime_handler")
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
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_ID_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PARENT_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_HANDLER_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    uid: str
    attempt: int
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    sandbox_id: str
    cgroup_parent: str
    runtime_handler: str
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., uid: _Optional[str] = ..., attempt: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., sandbox_id: _Optional[str] = ..., cgroup_parent: _Optional[str] = ..., runtime_handler: _Optional[str] = ...) -> None: ...

class ContainerMeta(_message.Message):
    __slots__ = ("name", "attempt", "id", "image", "labels", "annotations")
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
    NAME_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    attempt: int
    id: str
    image: str
    labels: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., attempt: _Optional[int] = ..., id: _Optional[str] = ..., image: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("container_path", "host_path", "readonly", "selinux_relabel", "propagation")
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    READONLY_FIELD_NUMBER: _ClassVar[int]
    SELINUX_RELABEL_FIELD_NUMBER: _ClassVar[int]
    PROPAGATION_FIELD_NUMBER: _ClassVar[int]
    container_path: str
    host_path: str
    readonly: bool
    selinux_relabel: bool
    propagation: MountPropagation
    def __init__(self, container_path: _Optional[str] = ..., host_path: _Optional[str] = ..., readonly: _Optional[bool] = ..., selinux_relabel: _Optional[bool] = ..., propagation: _Optional[_Union[MountPropagation, str]] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("container_path", "host_path", "permissions")
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    container_path: str
    host_path: str
    permissions: str
    def __init__(self, container_path: _Optional[str] = ..., host_path: _Optional[str] = ..., permissions: _Optional[str] = ...) -> None: ...

class LinuxResources(_message.Message):
    __slots__ = ("cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj", "cpuset_cpus", "cpuset_mems", "memory_swap_limit_in_bytes", "unified")
    class UnifiedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CPU_PERIOD_FIELD_NUMBER: _ClassVar[int]
    CPU_QUOTA_FIELD_NUMBER: _ClassVar[int]
    CPU_SHARES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    OOM_SCORE_ADJ_FIELD_NUMBER: _ClassVar[int]
    CPUSET_CPUS_FIELD_NUMBER: _ClassVar[int]
    CPUSET_MEMS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SWAP_LIMIT_IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNIFIED_FIELD_NUMBER: _ClassVar[int]
    cpu_period: int
    cpu_quota: int
    cpu_shares: int
    memory_limit_in_bytes: int
    oom_score_adj: int
    cpuset_cpus: str
    cpuset_mems: str
    memory_swap_limit_in_bytes: int
    unified: _containers.ScalarMap[str, str]
    def __init__(self, cpu_period: _Optional[int] = ..., cpu_quota: _Optional[int] = ..., cpu_shares: _Optional[int] = ..., memory_limit_in_bytes: _Optional[int] = ..., oom_score_adj: _Optional[int] = ..., cpuset_cpus: _Optional[str] = ..., cpuset_mems: _Optional[str] = ..., memory_swap_limit_in_bytes: _Optional[int] = ..., unified: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ContainerHookRequest(_message.Message):
    __slots__ = ("pod", "container", "envs", "mounts", "devices", "resources", "cdi_devices")
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    ENVS_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandboxMeta
    container: ContainerMeta
    envs: _containers.RepeatedCompositeFieldContainer[KeyValue]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    resources: LinuxResources
    cdi_devices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pod: _Optional[_Union[PodSandboxMeta, _Mapping]] = ..., container: _Optional[_Union[ContainerMeta, _Mapping]] = ..., envs: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., resources: _Optional[_Union[LinuxResources, _Mapping]] = ..., cdi_devices: _Optional[_Iterable[str]] = ...) -> None: ...

class PodSandboxHookRequest(_message.Message):
    __slots__ = ("pod", "resources")
    POD_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    pod: PodSandboxMeta
    resources: LinuxResources
    def __init__(self, pod: _Optional[_Union[PodSandboxMeta, _Mapping]] = ..., resources: _Optional[_Union[LinuxResources, _Mapping]] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class HookResponse(_message.Message):
    __slots__ = ("set_envs", "unset_envs", "add_mounts", "add_devices", "add_cdi_devices", "set_annotations", "remove_annotations", "resources", "rejection")
    class SetAnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SET_ENVS_FIELD_NUMBER: _ClassVar[int]
    UNSET_ENVS_FIELD_NUMBER: _ClassVar[int]
    ADD_MOUNTS_FIELD_NUMBER: _ClassVar[int]
    ADD_DEVICES_FIELD_NUMBER: _ClassVar[int]
    ADD_CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    SET_ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    REJECTION_FIELD_NUMBER: _ClassVar[int]
    set_envs: _containers.RepeatedCompositeFieldContainer[KeyValue]
    unset_envs: _containers.RepeatedScalarFieldContainer[str]
    add_mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    add_devices: _containers.RepeatedCompositeFieldContainer[Device]
    add_cdi_devices: _containers.RepeatedScalarFieldContainer[str]
    set_annotations: _containers.ScalarMap[str, str]
    remove_annotations: _containers.RepeatedScalarFieldContainer[str]
    resources: LinuxResources
    rejection: Rejection
    def __init__(self, set_envs: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., unset_envs: _Optional[_Iterable[str]] = ..., add_mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., add_devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., add_cdi_devices: _Optional[_Iterable[str]] = ..., set_annotations: _Optional[_Mapping[str, str]] = ..., remove_annotations: _Optional[_Iterable[str]] = ..., resources: _Optional[_Union[LinuxResources, _Mapping]] = ..., rejection: _Optional[_Union[Rejection, _Mapping]] = ...) -> None: ...
