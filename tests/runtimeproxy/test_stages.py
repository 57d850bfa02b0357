"""The hook stages are the RuntimeHooks service's methods, read from its descriptor, not a list of their own."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from apis.fgpu.v1 import hooks_pb2
from runtimeproxy.hookconfig import Stage
from runtimeproxy.stages import RUNTIME_HOOKS, Stages

SERVICE = hooks_pb2.DESCRIPTOR.services_by_name["RuntimeHooks"]


def test_the_stages_are_the_methods_of_runtime_hooks_in_the_order_it_declares_them() -> None:
    assert list(RUNTIME_HOOKS) == [m.name for m in SERVICE.methods]
    for name, stage in RUNTIME_HOOKS.items():
        assert stage.path == f"/fgpu.v1.RuntimeHooks/{name}"
        assert stage.pre is name.startswith("Pre")


def test_a_stage_is_named_by_its_constant_as_well() -> None:
    assert Stage.PRE_CREATE_CONTAINER is RUNTIME_HOOKS["PreCreateContainer"]
    assert Stage.POST_STOP_POD_SANDBOX is RUNTIME_HOOKS["PostStopPodSandbox"]
    with pytest.raises(AttributeError, match="no stage PRE_CREATE"):
        _ = Stage.PRE_CREATE


def _service(method: str, output: str = ".fgpu.v1.HookResponse", *, streaming: bool = False) -> Stages:
    """A hooks service of one method, in a pool of its own beside hooks.proto."""
    hooks_file = descriptor_pb2.FileDescriptorProto()
    hooks_pb2.DESCRIPTOR.CopyToProto(hooks_file)
    test_file = descriptor_pb2.FileDescriptorProto(
        name="test_hooks.proto", package="fgpu.test", syntax="proto3", dependency=[hooks_file.name]
    )
    test_file.service.add(name="Hooks").method.add(
        name=method, input_type=".fgpu.v1.ContainerHookRequest", output_type=output, server_streaming=streaming
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(hooks_file)
    pool.Add(test_file)
    return Stages.of_service(pool.FindServiceByName("fgpu.test.Hooks"))


def test_a_stage_of_another_service_is_called_by_that_services_path() -> None:
    (stage,) = _service("PostReopenContainerLog").values()
    assert (stage.name, stage.path, stage.pre) == ("PostReopenContainerLog", "/fgpu.test.Hooks/PostReopenContainerLog", False)


@pytest.mark.parametrize(
    ("method", "output", "streaming", "says"),
    [
        pytest.param("OnCreateContainer", ".fgpu.v1.HookResponse", False, "starts with Pre", id="neither Pre nor Post"),
        pytest.param("PreCreateContainer", ".fgpu.v1.ContainerHookRequest", False, "not fgpu.v1.HookResponse",
                     id="answers something else"),
        pytest.param("PreCreateContainer", ".fgpu.v1.HookResponse", True, "unary", id="streams"),
    ],
)
def test_a_hooks_method_that_is_no_stage_fails_loudly(method: str, output: str, streaming: bool, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        _service(method, output, streaming=streaming)
