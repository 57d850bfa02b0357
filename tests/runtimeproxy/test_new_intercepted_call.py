"""Issue 21's walkthrough, done: a CRI call the proxy does not intercept, hooked with the protos + 1 spec + 1 codec pair.

The call is ReopenContainerLog (kubelet's log rotation), hooked as a
notification at a new stage, PostReopenContainerLog. Every step is in this
file; no proxy module changes:

1. the protos: its request in runtime_partial.proto and the stage's rpc in
   hooks.proto. Here both files are loaded as they would read with the
   lines added, into a descriptor pool of their own instead of regenerated;
2. one spec (`CallSpec`), in a test-only registry (`CallSpecs`) beside the
   proxy's own specs, whose stages come from the edited hooks service;
3. one codec pair: the hook request built from the CRI request and the
   container the runtime names (a notification applies no answer).

Then the proxy runs in front of containerd with that registry, a hook server
registers for the new stage, and hears about the pod when kubelet reopens a
container's log.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from apis import names
from apis.cri.v1 import runtime_partial_pb2 as cri
from apis.fgpu.v1 import hooks_pb2
from runtimeproxy import cri_calls, crimsg
from runtimeproxy.call_specs import ByContainerId, CallSpec, CallSpecs, Subject
from runtimeproxy.stages import Stages
from tests.runtimeproxy.hookserver import TestHookServer, write_hook_config
from tests.runtimeproxy.kubelet import RUNTIME, ContainerSpec, PodSpec
from tests.runtimeproxy.rig import ProxyRig

pytestmark = pytest.mark.containerd

REOPEN_CONTAINER_LOG = f"/{names.CRI_RUNTIME_SERVICE}/ReopenContainerLog"


# --- 1. the protos ---------------------------------------------------------------------------------

def _edited_protos() -> descriptor_pool.DescriptorPool:
    cri_file = descriptor_pb2.FileDescriptorProto()
    cri.DESCRIPTOR.CopyToProto(cri_file)
    # message ReopenContainerLogRequest { string container_id = 1; }
    cri_file.message_type.add(name="ReopenContainerLogRequest").field.add(
        name="container_id", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    hooks_file = descriptor_pb2.FileDescriptorProto()
    hooks_pb2.DESCRIPTOR.CopyToProto(hooks_file)
    # service RuntimeHooks { ...; rpc PostReopenContainerLog(ContainerHookRequest) returns (HookResponse); }
    (service,) = (s for s in hooks_file.service if s.name == "RuntimeHooks")
    service.method.add(
        name="PostReopenContainerLog", input_type=".fgpu.v1.ContainerHookRequest", output_type=".fgpu.v1.HookResponse"
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(cri_file)
    pool.Add(hooks_file)
    return pool


PROTOS = _edited_protos()
HOOKS_SERVICE = PROTOS.FindServiceByName("fgpu.v1.RuntimeHooks")
STAGES = Stages.of_service(HOOKS_SERVICE)
ReopenContainerLogRequest: Any = message_factory.GetMessageClass(
    PROTOS.FindMessageTypeByName(f"{cri.DESCRIPTOR.package}.ReopenContainerLogRequest")
)


# --- 3. the codec pair -----------------------------------------------------------------------------

def reopen_log_to_hook(req: Any, found: Subject) -> hooks_pb2.ContainerHookRequest:
    return crimsg.container_to_hook(found.runtime_container(), crimsg.pod_meta_from_status(found.runtime_sandbox()))


# --- 2. the spec, in a test-only registry -----------------------------------------------------------

REOPEN_SPEC = CallSpec(
    method="ReopenContainerLog",
    request_type=ReopenContainerLogRequest,
    stage=STAGES["PostReopenContainerLog"],
    pod=ByContainerId(lambda req: req.container_id),
    build=reopen_log_to_hook,
)
CALLS = CallSpecs([*cri_calls.SPECS, REOPEN_SPEC], stages=STAGES)


def test_the_proxy_as_shipped_does_not_intercept_the_call() -> None:
    assert REOPEN_CONTAINER_LOG.encode() not in cri_calls.SPECS.by_path
    assert "PostReopenContainerLog" not in cri_calls.SPECS.stages
    assert CALLS.by_path[REOPEN_CONTAINER_LOG.encode()] is REOPEN_SPEC


def test_a_hook_registered_for_the_new_stage_hears_about_the_pod_whose_container_log_kubelet_reopens(
    rig: ProxyRig, tmp_path: Any
) -> None:
    hook_server = TestHookServer(socket_path=str(tmp_path / "hooks.sock"), service=HOOKS_SERVICE).start()
    try:
        write_hook_config(rig.hook_dir, name="log-watcher", endpoint=hook_server.endpoint, policy="Ignore",
                          stages=["PostReopenContainerLog"])
        rig.calls = CALLS
        rig.start()
        with rig.kubelet() as k:
            pod = k.run_pod(PodSpec(name="rotated", namespace="team-b"))
            cid = k.create_container(pod, ContainerSpec(name="writer", command=["sleep", "30"]))
            k.start_container(cid)
            try:
                k.raw(RUNTIME + "ReopenContainerLog", ReopenContainerLogRequest(container_id=cid).SerializeToString())
                deadline = time.monotonic() + 10
                while not hook_server.requests("PostReopenContainerLog") and time.monotonic() < deadline:
                    time.sleep(0.02)
            finally:
                k.stop_container(cid)
                k.remove_container(cid)
                k.teardown(pod)
    finally:
        hook_server.stop()
    (req,) = hook_server.requests("PostReopenContainerLog")
    assert (req.pod.namespace, req.pod.name, req.pod.uid) == ("team-b", "rotated", pod.spec.uid)
    assert (req.container.name, req.container.id) == ("writer", cid)
    assert rig.metric("fgpu_runtime_proxy_hook_calls_total", {"server": "log-watcher", "stage": "PostReopenContainerLog"}) == 1
    # the hook is registered for the new stage only: the others were not called
    assert hook_server.stages() == ["PostReopenContainerLog"]
