"""The CRI calls the proxy intercepts: one `CallSpec` each (what each field says: `call_specs`).

| CRI method | stage | intercepted |
| --- | --- | --- |
| RunPodSandbox | PreRunPodSandbox | while a hook is registered for the stage |
| CreateContainer | PreCreateContainer | always (the void default, GPU pods fail-closed) |
| UpdateContainerResources | PreUpdateContainerResources | while a hook is registered |
| StartContainer, StopContainer | PostStartContainer, PostStopContainer | while a hook is registered |
| StopPodSandbox | PostStopPodSandbox | while a hook is registered |
| RemoveContainer, RemovePodSandbox | none: logged | always |

Every other call passes through untouched. To intercept another one: its
request in proto/cri/v1/runtime_partial.proto (and, for a new stage, its rpc
in proto/fgpu/v1/hooks.proto), a spec here, and its codec pair in `crimsg`.
"""

from __future__ import annotations

from apis.cri.v1 import runtime_partial_pb2 as cri
from apis.fgpu.v1 import hooks_pb2
from runtimeproxy import crimsg
from runtimeproxy.call_specs import ByContainerId, BySandboxId, CallSpec, CallSpecs, InRequest, Subject
from runtimeproxy.stages import RUNTIME_HOOKS


def _container(found: Subject) -> hooks_pb2.ContainerHookRequest:
    """The hook request of a call that names its container by ID, from what the runtime said of it."""
    return crimsg.container_to_hook(found.runtime_container(), crimsg.pod_meta_from_status(found.runtime_sandbox()))


RUN_POD_SANDBOX = CallSpec(
    method="RunPodSandbox",
    request_type=cri.RunPodSandboxRequest,
    stage=RUNTIME_HOOKS["PreRunPodSandbox"],
    pod=InRequest(lambda req: req.config),
    build=lambda req, _: crimsg.run_sandbox_request_to_hook(req),
    apply=lambda req, edits: crimsg.apply_sandbox_edits(req.config, edits),
)

CREATE_CONTAINER = CallSpec(
    method="CreateContainer",
    request_type=cri.CreateContainerRequest,
    stage=RUNTIME_HOOKS["PreCreateContainer"],
    pod=InRequest(
        lambda req: req.sandbox_config,
        ident=lambda req: {"container": req.config.metadata.name, "sandbox_id": req.pod_sandbox_id},
    ),
    build=lambda req, _: crimsg.create_request_to_hook(req),
    apply=lambda req, edits: crimsg.apply_container_edits(req.config, edits),
    gpu_container=lambda req: req.config,
)

UPDATE_CONTAINER_RESOURCES = CallSpec(
    method="UpdateContainerResources",
    request_type=cri.UpdateContainerResourcesRequest,
    stage=RUNTIME_HOOKS["PreUpdateContainerResources"],
    pod=ByContainerId(lambda req: req.container_id),
    build=lambda req, found: crimsg.container_to_hook(
        found.runtime_container(), crimsg.pod_meta_from_status(found.runtime_sandbox()), resources=req.linux
    ),
    apply=crimsg.apply_update_edits,
)

START_CONTAINER = CallSpec(
    method="StartContainer",
    request_type=cri.StartContainerRequest,
    stage=RUNTIME_HOOKS["PostStartContainer"],
    pod=ByContainerId(lambda req: req.container_id),
    build=lambda _, found: _container(found),
)

STOP_CONTAINER = CallSpec(
    method="StopContainer",
    request_type=cri.StopContainerRequest,
    stage=RUNTIME_HOOKS["PostStopContainer"],
    pod=ByContainerId(lambda req: req.container_id),
    build=lambda _, found: _container(found),
)

STOP_POD_SANDBOX = CallSpec(
    method="StopPodSandbox",
    request_type=cri.StopPodSandboxRequest,
    stage=RUNTIME_HOOKS["PostStopPodSandbox"],
    pod=BySandboxId(lambda req: req.pod_sandbox_id),
    build=lambda _, found: crimsg.sandbox_to_hook(found.runtime_sandbox()),
)

REMOVE_CONTAINER = CallSpec(
    method="RemoveContainer",
    request_type=cri.RemoveContainerRequest,
    stage=None,
    pod=ByContainerId(lambda req: req.container_id),
)

REMOVE_POD_SANDBOX = CallSpec(
    method="RemovePodSandbox",
    request_type=cri.RemovePodSandboxRequest,
    stage=None,
    pod=BySandboxId(lambda req: req.pod_sandbox_id),
)

#: the calls the proxy intercepts, by path
SPECS = CallSpecs(
    [
        RUN_POD_SANDBOX,
        STOP_POD_SANDBOX,
        REMOVE_POD_SANDBOX,
        CREATE_CONTAINER,
        START_CONTAINER,
        STOP_CONTAINER,
        REMOVE_CONTAINER,
        UPDATE_CONTAINER_RESOURCES,
    ]
)
