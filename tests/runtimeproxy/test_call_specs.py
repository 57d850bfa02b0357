"""One spec per intercepted CRI call: which calls the proxy intercepts, when, and specs that do not fit."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from apis import names
from apis.cri.v1 import runtime_partial_pb2 as cri
from runtimeproxy import cri_calls
from runtimeproxy.call_specs import CallSpec, CallSpecs
from runtimeproxy.calls import Forward, Refuse, StreamKind
from runtimeproxy.errors import RuntimeLookupError
from runtimeproxy.hookclient import HookClient
from runtimeproxy.hookconfig import HookRegistry
from runtimeproxy.interception import HookedCalls
from runtimeproxy.metrics import ProxyMetrics
from runtimeproxy.stages import RUNTIME_HOOKS, Stage

PASS, EDIT, OBSERVE = StreamKind.PASS, StreamKind.EDIT, StreamKind.OBSERVE


def _handler(registry: HookRegistry) -> HookedCalls:
    metrics = ProxyMetrics()
    return HookedCalls(registry=registry, hooks=HookClient(metrics=metrics), runtime=None,  # type: ignore[arg-type]
                       metrics=metrics, force_void=True, hook_server_namespaces=())


@pytest.fixture
def every_stage_hooked(tmp_path: Path) -> HookRegistry:
    (tmp_path / "10-all.yaml").write_text(
        f"name: all\nendpoint: unix:///all.sock\nstages: [{', '.join(RUNTIME_HOOKS)}]\n"
    )
    return HookRegistry(str(tmp_path))


@pytest.mark.parametrize(
    ("method", "no_hook", "hooked"),
    [
        ("RunPodSandbox", PASS, EDIT),
        ("CreateContainer", EDIT, EDIT),
        ("UpdateContainerResources", PASS, EDIT),
        ("StartContainer", PASS, OBSERVE),
        ("StopContainer", PASS, OBSERVE),
        ("StopPodSandbox", PASS, OBSERVE),
        ("RemoveContainer", OBSERVE, OBSERVE),
        ("RemovePodSandbox", OBSERVE, OBSERVE),
        ("ListContainers", PASS, PASS),
        ("ReopenContainerLog", PASS, PASS),
        ("MethodFromANewerCRI", PASS, PASS),
    ],
)
def test_a_call_is_intercepted_while_a_hook_is_registered_for_its_stage_or_always_when_its_spec_says(
    every_stage_hooked: HookRegistry, method: str, no_hook: StreamKind, hooked: StreamKind
) -> None:
    path = f"/{names.CRI_RUNTIME_SERVICE}/{method}".encode()
    assert _handler(HookRegistry(None)).classify(path) is no_hook
    assert _handler(every_stage_hooked).classify(path) is hooked


def test_image_service_and_other_services_pass(every_stage_hooked: HookRegistry) -> None:
    for path in (f"/{names.CRI_IMAGE_SERVICE}/PullImage", "/test.Echo/Unary", "/runtime.v1.RuntimeService"):
        assert _handler(every_stage_hooked).classify(path.encode()) is PASS


def test_each_stage_of_runtime_hooks_is_the_stage_of_exactly_one_intercepted_call() -> None:
    # a new rpc in hooks.proto without a spec that uses it fails here
    used = [spec.stage.name for spec in cri_calls.SPECS if spec.stage is not None]
    assert sorted(used) == sorted(RUNTIME_HOOKS)
    by_method = {spec.method: spec.stage.name for spec in cri_calls.SPECS if spec.stage is not None}
    assert by_method == {
        "RunPodSandbox": "PreRunPodSandbox",
        "CreateContainer": "PreCreateContainer",
        "UpdateContainerResources": "PreUpdateContainerResources",
        "StartContainer": "PostStartContainer",
        "StopContainer": "PostStopContainer",
        "StopPodSandbox": "PostStopPodSandbox",
    }


_OTHER_SERVICES_STAGE = Stage(name="PostStartContainer", path="/other.Hooks/PostStartContainer", pre=False)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        pytest.param(replace(cri_calls.START_CONTAINER, apply=lambda req, edits: None), "stage applies hooks' answers",
                     id="a notification that edits"),
        pytest.param(replace(cri_calls.STOP_POD_SANDBOX, gpu_container=lambda req: None), "stage applies hooks' answers",
                     id="a notification with a void default"),
        pytest.param(replace(cri_calls.RUN_POD_SANDBOX, apply=None), "needs `apply`", id="an edit that applies nothing"),
        pytest.param(replace(cri_calls.STOP_CONTAINER, build=None), "needs `build`", id="a hook request from nowhere"),
        pytest.param(replace(cri_calls.REMOVE_CONTAINER, build=cri_calls.START_CONTAINER.build), "only logged",
                     id="a hook request without a stage"),
        pytest.param(replace(cri_calls.START_CONTAINER, stage=_OTHER_SERVICES_STAGE), "is not one of",
                     id="a stage hook servers do not implement"),
    ],
)
def test_a_spec_that_does_not_fit_its_stage_is_refused_at_load(spec: CallSpec[Any], says: str) -> None:
    with pytest.raises(ValueError, match=says) as err:
        CallSpecs([spec])
    assert spec.path.decode() in str(err.value)


def test_a_method_intercepted_twice_is_refused_at_load() -> None:
    with pytest.raises(ValueError, match="intercepts this method already"):
        CallSpecs([*cri_calls.SPECS, replace(cri_calls.STOP_CONTAINER, stage=RUNTIME_HOOKS["PostStartContainer"])])


class _RuntimeThatCannotTell:
    """The runtime the proxy asks which pod a call is for, answering with one lookup error."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def container(self, container_id: str) -> Any:
        raise self.error

    async def sandbox(self, sandbox_id: str) -> Any:
        raise self.error


def _update_handler(tmp_path: Path, policy: str, error: Exception) -> HookedCalls:
    (tmp_path / "10-update.yaml").write_text(
        f"name: update\nendpoint: unix:///update.sock\nstages: [PreUpdateContainerResources]\nfailurePolicy: {policy}\n"
    )
    metrics = ProxyMetrics()
    return HookedCalls(registry=HookRegistry(str(tmp_path)), hooks=HookClient(metrics=metrics),
                       runtime=_RuntimeThatCannotTell(error),  # type: ignore[arg-type]
                       metrics=metrics, force_void=True, hook_server_namespaces=())


@pytest.mark.parametrize(
    ("policy", "not_found", "refused"),
    [
        ("Fail", False, True),  # the runtime cannot be asked: a hook that must run is not skipped
        ("Fail", True, False),  # no such container: the runtime fails the call itself
        ("Ignore", False, False),  # no hook must run
    ],
)
def test_a_call_whose_pod_the_runtime_cannot_tell_is_refused_only_when_a_hook_must_run(
    tmp_path: Path, policy: str, not_found: bool, refused: bool
) -> None:
    error = RuntimeLookupError("ListContainers(id=abc): UNAVAILABLE: connection refused", not_found=not_found)
    handler = _update_handler(tmp_path, policy, error)
    request = cri.UpdateContainerResourcesRequest(container_id="abc").SerializeToString()
    path = f"/{names.CRI_RUNTIME_SERVICE}/UpdateContainerResources".encode()
    answer = asyncio.run(handler.edit(path, request))
    if refused:
        assert isinstance(answer, Refuse)
        assert answer.code == 14  # UNAVAILABLE: kubelet retries
        assert "hook update (failurePolicy Fail) could not run" in answer.message
        assert "connection refused" in answer.message
    else:
        assert answer == Forward()
