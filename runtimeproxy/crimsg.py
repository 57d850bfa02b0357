"""Adapter between the CRI messages (partial schema), the RuntimeHooks messages and the edit values.

The codec pairs of the intercepted calls (`cri_calls`): `*_to_hook` builds a
hook request from a CRI request, `apply_*_edits` applies a hook's answer (read by
`apis.container_edits.from_proto`) to it.

Edits are applied to the decoded CRI message in place: entries the hooks do
not touch stay the very same protobuf entries, so their unknown fields (from
newer CRI versions) are written back unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apis import names
from apis.container_edits import RESOURCE_FIELDS, CgroupResources, ContainerEdits
from apis.cri.v1 import runtime_partial_pb2 as cri
from apis.fgpu.v1 import hooks_pb2
from runtimeproxy.edits import merge_annotations, merge_by_key, merge_env, merge_names
from runtimeproxy.verdicts import PodFacts


def pod_facts(metadata: Any, labels: Any, annotations: Any) -> PodFacts:
    return PodFacts(
        namespace=metadata.namespace, name=metadata.name, uid=metadata.uid,
        labels=dict(labels), annotations=dict(annotations),
    )


def pod_facts_from_config(config: cri.PodSandboxConfig) -> PodFacts:
    return pod_facts(config.metadata, config.labels, config.annotations)


def pod_facts_from_status(status: cri.PodSandboxStatus) -> PodFacts:
    return pod_facts(status.metadata, status.labels, status.annotations)


def pod_meta_from_config(
    config: cri.PodSandboxConfig, *, sandbox_id: str = "", runtime_handler: str = ""
) -> hooks_pb2.PodSandboxMeta:
    md = config.metadata
    return hooks_pb2.PodSandboxMeta(
        name=md.name, namespace=md.namespace, uid=md.uid, attempt=md.attempt,
        labels=dict(config.labels), annotations=dict(config.annotations), sandbox_id=sandbox_id,
        cgroup_parent=config.linux.cgroup_parent, runtime_handler=runtime_handler,
    )


def pod_meta_from_status(status: cri.PodSandboxStatus) -> hooks_pb2.PodSandboxMeta:
    md = status.metadata
    return hooks_pb2.PodSandboxMeta(
        name=md.name, namespace=md.namespace, uid=md.uid, attempt=md.attempt,
        labels=dict(status.labels), annotations=dict(status.annotations), sandbox_id=status.id,
        runtime_handler=status.runtime_handler,
    )


def resources_to_hook(res: cri.LinuxContainerResources) -> hooks_pb2.LinuxResources:
    out = hooks_pb2.LinuxResources(unified=dict(res.unified))
    for name in RESOURCE_FIELDS:
        value = getattr(res, name)
        if value:
            setattr(out, name, value)
    return out


def run_sandbox_request_to_hook(req: cri.RunPodSandboxRequest) -> hooks_pb2.PodSandboxHookRequest:
    return hooks_pb2.PodSandboxHookRequest(
        pod=pod_meta_from_config(req.config, runtime_handler=req.runtime_handler),
        resources=resources_to_hook(req.config.linux.resources),
    )


def sandbox_to_hook(status: cri.PodSandboxStatus) -> hooks_pb2.PodSandboxHookRequest:
    return hooks_pb2.PodSandboxHookRequest(pod=pod_meta_from_status(status))


def create_request_to_hook(req: cri.CreateContainerRequest) -> hooks_pb2.ContainerHookRequest:
    cfg = req.config
    return hooks_pb2.ContainerHookRequest(
        pod=pod_meta_from_config(req.sandbox_config, sandbox_id=req.pod_sandbox_id),
        container=hooks_pb2.ContainerMeta(
            name=cfg.metadata.name, attempt=cfg.metadata.attempt, image=cfg.image.image,
            labels=dict(cfg.labels), annotations=dict(cfg.annotations),
        ),
        envs=[hooks_pb2.KeyValue(key=kv.key, value=kv.value.decode("utf-8", "replace")) for kv in cfg.envs],
        mounts=[
            hooks_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, readonly=m.readonly,
                selinux_relabel=m.selinux_relabel, propagation=m.propagation,  # type: ignore[arg-type]
            )
            for m in cfg.mounts
        ],
        devices=[
            hooks_pb2.Device(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in cfg.devices
        ],
        resources=resources_to_hook(cfg.linux.resources),
        cdi_devices=[d.name for d in cfg.CDI_devices],
    )


def container_to_hook(
    container: cri.Container, pod: hooks_pb2.PodSandboxMeta, *, resources: cri.LinuxContainerResources | None = None
) -> hooks_pb2.ContainerHookRequest:
    return hooks_pb2.ContainerHookRequest(
        pod=pod,
        container=hooks_pb2.ContainerMeta(
            name=container.metadata.name, attempt=container.metadata.attempt, id=container.id,
            image=container.image.image, labels=dict(container.labels), annotations=dict(container.annotations),
        ),
        resources=resources_to_hook(resources) if resources is not None else None,
    )


def _copies(items: Iterable[Any]) -> list[Any]:
    out = []
    for item in items:
        copy = type(item)()
        copy.CopyFrom(item)
        out.append(copy)
    return out


def _replace(repeated: Any, items: list[Any]) -> None:
    items = _copies(items)
    del repeated[:]
    repeated.extend(items)


def set_env(config: cri.ContainerConfig, set_envs: tuple[tuple[str, str], ...], unset: tuple[str, ...] = ()) -> None:
    current = [(kv.key, kv) for kv in config.envs]
    new = [(k, cri.KeyValue(key=k, value=v.encode())) for k, v in set_envs]
    merged = merge_env(current, set_envs=new, unset=set(unset))
    _replace(config.envs, [kv for _, kv in merged])


def apply_container_edits(config: cri.ContainerConfig, edits: ContainerEdits) -> None:
    if edits.envs or edits.unset_envs:
        set_env(config, edits.envs, edits.unset_envs)
    if edits.mounts:
        added = [
            cri.Mount(
                container_path=m.container_path, host_path=m.host_path, readonly=m.readonly,
                selinux_relabel=m.selinux_relabel, propagation=m.propagation.value,  # type: ignore[arg-type]
            )
            for m in edits.mounts
        ]
        _replace(config.mounts, merge_by_key(list(config.mounts), added, key=lambda m: m.container_path))
    if edits.devices:
        added_devices = [
            cri.Device(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in edits.devices
        ]
        _replace(config.devices, merge_by_key(list(config.devices), added_devices, key=lambda d: d.container_path))
    if edits.cdi_devices:
        existing = {d.name: d for d in config.CDI_devices}
        merged = merge_names([d.name for d in config.CDI_devices], list(edits.cdi_devices))
        _replace(config.CDI_devices, [existing.get(n) or cri.CDIDevice(name=n) for n in merged])
    if edits.set_annotations or edits.remove_annotations:
        _apply_annotations(config.annotations, edits)
    if not edits.resources.is_empty():
        apply_resources(config.linux.resources, edits.resources)


def _apply_annotations(target: Any, edits: ContainerEdits) -> None:
    merged = merge_annotations(dict(target), set_annotations=edits.set_annotations, remove=set(edits.remove_annotations))
    target.clear()
    target.update(merged)


def apply_sandbox_edits(config: cri.PodSandboxConfig, edits: ContainerEdits) -> None:
    if edits.set_annotations or edits.remove_annotations:
        _apply_annotations(config.annotations, edits)
    if not edits.resources.is_empty():
        apply_resources(config.linux.resources, edits.resources)


def apply_update_edits(req: cri.UpdateContainerResourcesRequest, edits: ContainerEdits) -> None:
    if edits.set_annotations or edits.remove_annotations:
        _apply_annotations(req.annotations, edits)
    if not edits.resources.is_empty():
        apply_resources(req.linux, edits.resources)


def apply_resources(target: cri.LinuxContainerResources, edit: CgroupResources) -> None:
    for name in RESOURCE_FIELDS:
        value = getattr(edit, name)
        if value is not None:
            setattr(target, name, value)
    for key, value in edit.unified.items():
        target.unified[key] = value


def force_void(config: cri.ContainerConfig) -> None:
    set_env(config, ((names.NVIDIA_VISIBLE_DEVICES, names.NVIDIA_VISIBLE_DEVICES_VOID),))
