"""The proxy's verdicts on hooked calls, table-driven: fail-closed for GPU pods, failure policies, rejections, void."""

from __future__ import annotations

import grpc
import pytest

from apis import names
from apis.container_edits import ContainerEdits
from runtimeproxy import verdicts
from runtimeproxy.hookconfig import FailurePolicy, Stage
from runtimeproxy.verdicts import HookOutcome, OutcomeKind, PodFacts

FAIL, IGNORE = FailurePolicy.FAIL, FailurePolicy.IGNORE
GPU_EDITS = ContainerEdits(envs=((names.NVIDIA_VISIBLE_DEVICES, "GPU-1"),))


def ok(server: str = "agent", edits: ContainerEdits = GPU_EDITS, p: FailurePolicy = IGNORE) -> HookOutcome:
    return HookOutcome(server=server, policy=p, kind=OutcomeKind.EDITS, edits=edits)


def failed(server: str = "agent", p: FailurePolicy = IGNORE) -> HookOutcome:
    return HookOutcome(server=server, policy=p, kind=OutcomeKind.FAILED, detail="UNAVAILABLE: down")


def rejected(server: str = "agent") -> HookOutcome:
    return HookOutcome(server=server, policy=IGNORE, kind=OutcomeKind.REJECTED, detail="bad signature")


CREATE = Stage.PRE_CREATE_CONTAINER
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]


@pytest.mark.parametrize(
    ("stage", "outcomes", "registered", "allocation", "code", "says"),
    [
        pytest.param(CREATE, [], 0, True, UNAVAILABLE, "no hook server is registered", id="gpu pod, no hook"),
        pytest.param(CREATE, [failed(p=IGNORE)], 1, True, UNAVAILABLE, "GPU allocation", id="gpu pod, Ignore hook down"),
        pytest.param(CREATE, [ok("a"), failed("b", p=IGNORE)], 2, True, UNAVAILABLE, "'b' failed", id="gpu pod, 2nd hook down"),
        pytest.param(CREATE, [ok("other", edits=ContainerEdits(envs=(("A", "1"),)))], 1, True, FAILED_PRECONDITION,
                     "no hook server set NVIDIA_VISIBLE_DEVICES", id="gpu pod, hooks answered without GPU settings"),
        pytest.param(CREATE, [ok("agent"), ok("other", edits=ContainerEdits(unset_envs=(names.NVIDIA_VISIBLE_DEVICES,)))], 2, True,
                     FAILED_PRECONDITION, "no hook server set NVIDIA_VISIBLE_DEVICES",
                     id="gpu pod, a later hook unsets the GPU settings"),
        pytest.param(CREATE, [failed(p=FAIL)], 1, False, UNAVAILABLE, "failurePolicy is Fail", id="Fail hook down"),
        pytest.param(CREATE, [rejected()], 1, False, FAILED_PRECONDITION, "bad signature", id="rejection"),
        pytest.param(Stage.PRE_RUN_POD_SANDBOX, [failed(p=FAIL)], 1, True, UNAVAILABLE, "failurePolicy is Fail",
                     id="sandbox Fail hook down"),
    ],
)
def test_refusals(
    stage: Stage, outcomes: list[HookOutcome], registered: int, allocation: bool, code: int, says: str
) -> None:
    judgement = verdicts.judge(stage, outcomes=outcomes, registered=registered, allocation=allocation)
    assert judgement.refusal is not None and says in judgement.refusal
    assert judgement.code == code


@pytest.mark.parametrize(
    ("stage", "outcomes", "registered", "allocation", "edits", "ignored"),
    [
        pytest.param(CREATE, [], 0, False, 0, 0, id="no gpu, no hook"),
        pytest.param(CREATE, [failed(p=IGNORE)], 1, False, 0, 1, id="no gpu, Ignore hook down"),
        pytest.param(CREATE, [ok("a"), ok("b")], 2, True, 2, 0, id="gpu pod, both answered"),
        pytest.param(CREATE, [ok("other", edits=ContainerEdits(envs=(("A", "1"),))), ok("agent")], 2, True, 2, 0,
                     id="gpu pod, GPU settings from the second hook"),
        pytest.param(CREATE, [ok(edits=ContainerEdits(cdi_devices=("nvidia.com/gpu=0",)))], 1, True, 1, 0,
                     id="gpu pod, GPUs given as CDI devices"),
        pytest.param(CREATE, [ok("other", edits=ContainerEdits(envs=(("A", "1"),)))], 1, False, 1, 0,
                     id="no gpu, hook without GPU settings"),
        pytest.param(Stage.PRE_RUN_POD_SANDBOX, [failed(p=IGNORE)], 1, True, 0, 1, id="sandbox: only containers are gated"),
        pytest.param(Stage.POST_START_CONTAINER, [failed(p=FAIL), rejected()], 2, True, 0, 2, id="post stages never refuse"),
        pytest.param(Stage.POST_START_CONTAINER, [ok()], 1, True, 0, 0, id="post stage edits are ignored"),
    ],
)
def test_calls_that_go_ahead(
    stage: Stage, outcomes: list[HookOutcome], registered: int, allocation: bool, edits: int, ignored: int
) -> None:
    judgement = verdicts.judge(stage, outcomes=outcomes, registered=registered, allocation=allocation)
    assert judgement.refusal is None
    assert len(judgement.edits) == edits
    assert len(judgement.ignored) == ignored


def test_a_refusing_outcome_stops_further_hook_calls() -> None:
    assert verdicts.stop_early(CREATE, failed(p=IGNORE), allocation=True)
    assert not verdicts.stop_early(CREATE, failed(p=IGNORE), allocation=False)
    assert verdicts.stop_early(CREATE, rejected(), allocation=False)
    # A first hook without GPU settings does not stop the call: a later one may supply them.
    assert not verdicts.stop_early(CREATE, ok("other", edits=ContainerEdits(envs=(("A", "1"),))), allocation=True)


@pytest.mark.parametrize(
    ("edits", "force", "void"),
    [
        pytest.param([], True, True, id="no hook answer"),
        pytest.param([ContainerEdits(envs=(("OTHER", "1"),))], True, True, id="hook set other vars"),
        pytest.param([GPU_EDITS], True, False, id="hook set the variable"),
        pytest.param([GPU_EDITS, ContainerEdits(unset_envs=(names.NVIDIA_VISIBLE_DEVICES,))], True, True,
                     id="a later hook unset it: the image's value must not come back"),
        pytest.param([ContainerEdits(unset_envs=(names.NVIDIA_VISIBLE_DEVICES,)), GPU_EDITS], True, False,
                     id="unset, then set by a later hook"),
        pytest.param([], False, False, id="turned off"),
    ],
)
def test_void_unless_a_hook_set_the_variable(edits: list[ContainerEdits], force: bool, void: bool) -> None:
    assert verdicts.needs_void(edits, force_void=force) is void


def pod(*, namespace: str = "fgpu-system", labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> PodFacts:
    return PodFacts(namespace=namespace, name="p", uid="u", labels=labels or {}, annotations=annotations or {})


@pytest.mark.parametrize(
    ("facts", "allowed", "bypass"),
    [
        pytest.param(pod(labels={names.HOOK_SERVER_LABEL: "true"}), ("fgpu-system",), True, id="labelled, allowed ns"),
        pytest.param(pod(labels={names.HOOK_SERVER_LABEL: "true"}, namespace="default"), ("fgpu-system",), False,
                     id="labelled, other ns"),
        pytest.param(pod(labels={names.HOOK_SERVER_LABEL: "true"}, namespace="default"), (), False,
                     id="an empty list allows no namespace"),
        pytest.param(pod(labels={names.HOOK_SERVER_LABEL: "true"}, namespace="default"), ("*",), True,
                     id="any ns only when asked with *"),
        pytest.param(pod(labels={names.HOOK_SERVER_LABEL: "false"}), ("fgpu-system",), False, id="label false"),
        pytest.param(pod(), ("fgpu-system",), False, id="unlabelled"),
    ],
)
def test_hook_server_pods_bypass_hooks_only_where_allowed(facts: PodFacts, allowed: tuple[str, ...], bypass: bool) -> None:
    assert verdicts.bypasses_hooks(facts, hook_server_namespaces=allowed) is bypass


def test_a_gpu_pod_is_one_whose_allocation_lists_a_gpu() -> None:
    listed = '{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50"}}]}'
    assert verdicts.has_allocation(pod(annotations={names.DEVICE_ALLOCATED: listed}))
    # An allocation that cannot be read is a GPU pod's (fail-closed: the hook refuses it with the reason).
    assert verdicts.has_allocation(pod(annotations={names.DEVICE_ALLOCATED: "{not json"}))
    assert verdicts.has_allocation(pod(annotations={names.DEVICE_ALLOCATED: '{"gpu":"x"}'}))


@pytest.mark.parametrize("value", ["{}", '{"gpu":[]}', '{"rdma":[{"minor":0}]}', ""])
def test_an_allocation_that_lists_no_gpu_is_no_allocation(value: str) -> None:
    assert not verdicts.has_allocation(pod(annotations={names.DEVICE_ALLOCATED: value}))
    assert not verdicts.has_allocation(pod())
