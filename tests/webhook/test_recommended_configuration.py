"""The webhook configurations docs/webhook.md recommends: valid objects, pointing at what the webhook serves,
and match conditions that never hide a pod the webhook would change or refuse.

The match conditions are CEL; cel-python evaluates them here as the API server
would (tests/localup/admission.py does the same for the admission policies).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import celpy
import jsonpatch
import kubernetes_validate
import pytest
import yaml
from celpy.adapter import json_to_cel

from apis import names
from apis.translation import TranslationRules
from tests.webhook.examples import INVALID, VALID
from tests.webhook.reviews import Pod, pod
from webhook.mutating import SCHEDULER_ANNOTATIONS, mutate_pod
from webhook.scope import Scope
from webhook.validating import validate_pod

DOC = Path(__file__).resolve().parents[2] / "docs" / "webhook.md"
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
RULES = TranslationRules.default()


def recommended() -> dict[str, dict[str, Any]]:
    """kind -> the object, from the yaml block that holds both configurations."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "kind: MutatingWebhookConfiguration" in b]
    return {doc["kind"]: doc for doc in yaml.safe_load_all(block)}


CONFIGS = recommended()
MUTATING = CONFIGS["MutatingWebhookConfiguration"]["webhooks"][0]
VALIDATING = CONFIGS["ValidatingWebhookConfiguration"]["webhooks"][0]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_the_configurations_are_valid_objects(kind: str, version: str) -> None:
    kubernetes_validate.validate(CONFIGS[kind], version, strict=True)


def test_they_call_what_the_webhook_serves_with_the_documented_failure_behaviour() -> None:
    for webhook, path, policy in ((MUTATING, names.WEBHOOK_MUTATE_PATH, "Ignore"),
                                  (VALIDATING, names.WEBHOOK_VALIDATE_PATH, "Fail")):
        assert webhook["clientConfig"]["service"]["path"] == path
        assert webhook["admissionReviewVersions"] == ["v1"]
        assert webhook["sideEffects"] == "None"
        assert webhook["failurePolicy"] == policy
        assert webhook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                     "resources": ["pods"], "scope": "Namespaced"}]
        (excluded,) = webhook["namespaceSelector"]["matchExpressions"]
        assert excluded["key"] == "kubernetes.io/metadata.name" and excluded["operator"] == "NotIn"
        assert set(excluded["values"]) == {"kube-system", "fgpu-system"}
    assert MUTATING["timeoutSeconds"] <= 3 < VALIDATING["timeoutSeconds"]


def matches(webhook: dict[str, Any], obj: Pod) -> bool:
    environment = celpy.Environment()
    activation = {"object": json_to_cel(obj)}
    results = []
    for condition in webhook["matchConditions"]:
        program = environment.program(environment.compile(condition["expression"]))
        results.append(bool(program.evaluate(activation)))
    return all(results)


SHARE = {names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}
BAD = {names.GPU_CORE: "150", names.GPU_MEMORY_RATIO: "150"}
PODS = [
    *VALID, *INVALID,
    pod(resources=SHARE), pod(resources=BAD), pod(resources=SHARE, scheduler=None), pod(resources=BAD, scheduler=None),
    pod(resources=SHARE, scheduler=names.SCHEDULER_NAME), pod(resources=BAD, scheduler=names.SCHEDULER_NAME),
    pod(resources=BAD, scheduler="koord-scheduler"), pod(resources={"cpu": "1"}),
    pod(resources={"cpu": "1"}, scheduler="other", annotations={names.ALLOCATION_SIGNATURE: "v2:k:x"}),
    pod(resources=SHARE, scheduler="other", annotations={"unrelated": "x"}),
    pod(resources=BAD, labels={names.SCHEDULER_INJECTION_LABEL: "false"}),
    pod(resources=SHARE, annotations=dict.fromkeys(SCHEDULER_ANNOTATIONS, "copied")),
]


@pytest.mark.parametrize("p", PODS, ids=[f"{i}-{p['metadata'].get('name', 'replica')}" for i, p in enumerate(PODS)])
def test_the_match_conditions_never_hide_a_pod_the_webhook_would_change_or_refuse(p: Pod) -> None:
    mutation = mutate_pod(p, namespace="ml", scope=Scope(), rules=RULES)
    if mutation.patch:
        assert matches(MUTATING, p), "the mutating webhook would change this pod but is not called"
    stored = jsonpatch.apply_patch(copy.deepcopy(p), [dict(op) for op in mutation.patch])
    refused = not validate_pod(stored, namespace="ml", scope=Scope(), rules=RULES).allowed
    if refused:
        assert matches(VALIDATING, stored), "the validating webhook would refuse this pod but is not called"
    assert matches(VALIDATING, stored) == (stored["spec"].get("schedulerName") == names.SCHEDULER_NAME)


def test_the_mutating_condition_skips_pods_of_other_schedulers_without_allocation_annotations() -> None:
    assert not matches(MUTATING, pod(resources=SHARE, scheduler="koord-scheduler"))
    assert not matches(MUTATING, pod(resources=SHARE, scheduler=names.SCHEDULER_NAME, annotations={"a": "b"}))
    assert matches(MUTATING, pod(resources={"cpu": "1"}))  # default-scheduler: the webhook decides
