"""The validating decision: a pod of fgpu's with an invalid request is refused with `fgpuctl validate`'s message."""

from __future__ import annotations

import copy
import io
import json
import sys
from typing import Any

import pytest

from apis import names
from apis.translation import TranslationRules
from fgpuctl.main import main as fgpuctl
from tests.webhook.examples import INVALID, VALID
from tests.webhook.reviews import Pod, pod, review
from webhook.admission import Admission
from webhook.scope import Scope
from webhook.validating import validate_pod

RULES = TranslationRules.default()


def fgpuctl_errors(p: Pod, capsys: pytest.CaptureFixture[str]) -> list[str]:
    sys.stdin = io.StringIO(json.dumps(p))
    try:
        code = fgpuctl(["validate", "-f", "-"])
    finally:
        sys.stdin = sys.__stdin__
    out, _ = capsys.readouterr()
    line = json.loads(out)
    assert code == (0 if line["valid"] else 1)
    return list(line.get("errors", []))


def admit(p: Pod | None, **kwargs: Any) -> dict[str, Any]:
    admission = Admission(scope=Scope(), rules=lambda: RULES)
    status, _, body = admission.handle("POST", "/validate?timeout=10s", json.dumps(review(p, **kwargs)).encode())
    assert status == 200
    response = json.loads(body)["response"]
    assert isinstance(response, dict)
    return response


@pytest.mark.parametrize("p", INVALID, ids=[p["metadata"]["name"] for p in INVALID])
def test_an_invalid_example_is_refused_with_the_message_fgpuctl_validate_prints(
    p: Pod, capsys: pytest.CaptureFixture[str]
) -> None:
    errors = fgpuctl_errors(p, capsys)
    assert errors
    response = admit(p)
    assert response["allowed"] is False
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": "; ".join(errors)}


@pytest.mark.parametrize("p", VALID, ids=[p["metadata"]["name"] for p in VALID])
def test_a_valid_example_is_allowed(p: Pod, capsys: pytest.CaptureFixture[str]) -> None:
    assert fgpuctl_errors(p, capsys) == []
    response = admit(p)
    assert response == {"uid": response["uid"], "allowed": True}


def test_the_message_names_the_container_the_resource_the_value_and_the_fix() -> None:
    bad = pod(resources={names.GPU_CORE: "150", names.GPU_MEMORY_RATIO: "50"}, scheduler=names.SCHEDULER_NAME)
    message = admit(bad)["status"]["message"]
    assert message.startswith('container "main": koordinator.sh/gpu-core=150: ')
    assert "multiple of 100" in message


BAD = {names.GPU_CORE: "150", names.GPU_MEMORY_RATIO: "150"}
JUDGED = [
    pytest.param(pod(resources=BAD, scheduler=names.SCHEDULER_NAME), Scope(), True, id="names-fgpu-scheduler"),
    pytest.param(pod(resources=BAD), Scope(), True, id="names-no-scheduler-so-the-mutation-would-apply"),
    pytest.param(pod(resources=BAD, scheduler=None), Scope(), True, id="scheduler-unset"),
    pytest.param(pod(resources=BAD, scheduler="koord-scheduler"), Scope(), False, id="another-products-scheduler"),
    pytest.param(pod(resources=BAD, labels={names.SCHEDULER_INJECTION_LABEL: "false"}), Scope(), False,
                 id="opted-out"),
    pytest.param(pod(resources=BAD), Scope(exclude_namespaces=frozenset({"ml"})), False, id="out-of-scope"),
    pytest.param(pod(resources=BAD, scheduler=names.SCHEDULER_NAME), Scope(exclude_namespaces=frozenset({"ml"})), True,
                 id="fgpu-scheduler-out-of-scope-still-judged"),
]


@pytest.mark.parametrize(("p", "scope", "refused"), JUDGED)
def test_only_pods_fgpu_places_are_judged(p: Pod, scope: Scope, refused: bool) -> None:
    verdict = validate_pod(p, namespace="ml", scope=scope, rules=RULES)
    assert verdict.allowed is not refused


def test_an_update_that_leaves_the_resources_alone_is_allowed_even_for_a_bad_pod() -> None:
    bad = pod(resources=BAD, scheduler=names.SCHEDULER_NAME, name="old-bad")
    labelled = copy.deepcopy(bad)
    labelled["metadata"]["labels"]["new"] = "label"
    assert admit(labelled, operation="UPDATE", old=bad)["allowed"] is True


def test_an_update_that_changes_the_gpu_request_is_checked() -> None:
    good = pod(resources={names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}, scheduler=names.SCHEDULER_NAME, name="p")
    bad = copy.deepcopy(good)
    bad["spec"]["containers"][0]["resources"] = {"limits": BAD}
    assert admit(bad, operation="UPDATE", old=good)["allowed"] is False
    assert admit(good, operation="UPDATE", old=bad)["allowed"] is True


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_deletes_and_connects_are_allowed(operation: str) -> None:
    bad = pod(resources=BAD, scheduler=names.SCHEDULER_NAME, name="p")
    assert admit(None, operation=operation, old=bad if operation == "DELETE" else None, namespace="ml")["allowed"] is True


def test_a_dry_run_gets_the_answer_the_real_request_gets() -> None:
    bad = pod(resources=BAD, scheduler=names.SCHEDULER_NAME)
    real, dry = admit(bad), admit(bad, dry_run=True)
    assert {**real, "uid": ""} == {**dry, "uid": ""}
