"""One spec per intercepted CRI call: which calls the proxy intercepts, when, and specs that do not fit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from apis import names
from runtimeproxy import cri_calls
from runtimeproxy.call_specs import CallSpec, CallSpecs
from runtimeproxy.calls import StreamKind
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
