"""The AdmissionReview envelope and the routes: what the framework answers before and after a decision."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apis import names
from apis.translation import TranslationRules
from tests.webhook.reviews import pod, review
from webhook import review as envelope
from webhook.admission import Admission
from webhook.scope import Scope

RULES = TranslationRules.default()
ADMISSION = Admission(scope=Scope(), rules=lambda: RULES)
GPU_POD = pod(resources={names.NVIDIA_GPU: 1})


def handle(method: str, path: str, body: bytes = b"") -> tuple[int, str, bytes]:
    return ADMISSION.handle(method, path, body)


def post(path: str, value: Any) -> tuple[int, Any]:
    status, content_type, body = handle("POST", path, json.dumps(value).encode())
    return status, json.loads(body) if content_type == "application/json" else body.decode()


def test_the_answer_echoes_the_uid_with_the_envelopes_version_and_kind() -> None:
    sent = review(GPU_POD)
    status, answer = post("/mutate?timeout=10s", sent)
    assert status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    assert envelope.decode_patch(response["patch"]) == [
        {"op": "replace", "path": "/spec/schedulerName", "value": "fgpu-scheduler"}]


def test_an_answer_without_changes_has_no_patch_fields() -> None:
    status, answer = post("/mutate", review(pod()))
    assert status == 200
    assert set(answer["response"]) == {"uid", "allowed"}


NOT_A_REVIEW = [
    pytest.param(b"", "not JSON", id="empty"),
    pytest.param(b"{", "not JSON", id="truncated"),
    pytest.param(b"\xff\xfe", "not JSON", id="not-utf8"),
    pytest.param(b"[1, 2]", "a JSON list, not an AdmissionReview", id="a-list"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "not JSON (RecursionError)", id="nested-too-deep"),
    pytest.param(b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}',
                 "only admission.k8s.io/v1 AdmissionReview is served", id="v1beta1"),
    pytest.param(b'{"apiVersion": "admission.k8s.io/v1", "kind": "ConversionReview"}', "kind 'ConversionReview'",
                 id="another-review"),
    pytest.param(b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "has no request", id="no-request"),
    pytest.param(b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"kind": {}}}',
                 "request.uid is missing", id="no-uid"),
]


@pytest.mark.parametrize(("body", "fragment"), NOT_A_REVIEW)
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_body_that_is_no_admission_review_gets_400_saying_why(path: str, body: bytes, fragment: str) -> None:
    status, content_type, answer = handle("POST", path, body)
    assert (status, content_type) == (400, "text/plain; charset=utf-8")
    assert fragment in answer.decode()


def malformed(change: dict[str, Any]) -> dict[str, Any]:
    sent = review(GPU_POD)
    sent["request"].update(change)
    return sent


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"operation": None}, "request.operation None"),
        ({"kind": "Pod"}, "request.kind 'Pod' is not a group/version/kind"),
        ({"object": ["not", "a", "pod"]}, "request.object is a JSON list"),
        ({"oldObject": "x"}, "request.oldObject is a JSON str"),
    ],
)
def test_a_review_with_a_uid_but_a_bad_field_is_refused_in_an_admission_review(change: dict[str, Any], fragment: str) -> None:
    sent = malformed(change)
    status, answer = post("/validate", sent)
    assert status == 200
    response = answer["response"]
    assert response["uid"] == sent["request"]["uid"] and response["allowed"] is False
    assert response["status"]["code"] == 400 and fragment in response["status"]["message"]


@pytest.mark.parametrize(
    ("kind", "resource"),
    [({"group": "apps", "version": "v1", "kind": "Deployment"}, "deployments"),
     ({"group": "", "version": "v1", "kind": "ConfigMap"}, "configmaps")],
)
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_review_of_another_kind_is_refused_saying_to_fix_the_rules(path: str, kind: dict[str, str], resource: str) -> None:
    status, answer = post(path, review({"metadata": {"name": "x", "namespace": "ml"}}, kind=kind, resource=resource))
    assert status == 200
    refusal = answer["response"]
    assert refusal["allowed"] is False and refusal["status"]["code"] == 400
    assert f"not {kind['group'] + '/' if kind['group'] else ''}v1 {kind['kind']}" in refusal["status"]["message"]
    assert "list only pods" in refusal["status"]["message"]


@pytest.mark.parametrize("sub_resource", ["status", "binding", "ephemeralcontainers"])
def test_a_write_to_a_pod_subresource_is_allowed_unchanged(sub_resource: str) -> None:
    sent = review(GPU_POD, operation="UPDATE", old=GPU_POD, sub_resource=sub_resource)
    _, answer = post("/mutate", sent)
    assert answer["response"] == {"uid": sent["request"]["uid"], "allowed": True}


# kube-apiserver sends a subresource write with the subresource's own kind: a bind is a CREATE of
# pods/binding with a v1 Binding, a drain's eviction a CREATE of pods/eviction with a policy/v1 Eviction.
BINDING = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p1", "namespace": "ml"},
           "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
EVICTION = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p1", "namespace": "ml"},
            "deleteOptions": {"gracePeriodSeconds": 30}}


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("sub_resource", "kind", "obj"),
    [("binding", {"group": "", "version": "v1", "kind": "Binding"}, BINDING),
     ("eviction", {"group": "policy", "version": "v1", "kind": "Eviction"}, EVICTION),
     ("eviction", {"group": "policy", "version": "v1beta1", "kind": "Eviction"}, EVICTION | {"apiVersion": "policy/v1beta1"})],
    ids=["binding", "eviction", "eviction-v1beta1"],
)
def test_a_subresource_write_of_another_kind_is_allowed_unchanged_not_refused_as_not_a_pod(
    path: str, sub_resource: str, kind: dict[str, str], obj: dict[str, Any]
) -> None:
    sent = review(obj, kind=kind, sub_resource=sub_resource)
    status, answer = post(path, sent)
    assert status == 200
    assert answer["response"] == {"uid": sent["request"]["uid"], "allowed": True}


def test_a_subresource_of_another_resource_is_still_refused_saying_to_fix_the_rules() -> None:
    # Only pods' subresources are waved through: deployments/scale means the rules list too much.
    kind = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    sent = review({"metadata": {"name": "train", "namespace": "ml"}}, kind=kind, resource="deployments",
                  sub_resource="scale", operation="UPDATE")
    _, answer = post("/validate", sent)
    refusal = answer["response"]
    assert refusal["allowed"] is False and refusal["status"]["code"] == 400
    assert "not autoscaling/v1 Scale (deployments)" in refusal["status"]["message"]


def test_a_pod_create_is_still_judged_next_to_subresource_writes() -> None:
    invalid = pod(resources={names.GPU_CORE: "150"}, scheduler="fgpu-scheduler")
    _, refused = post("/validate", review(invalid))
    _, patched = post("/mutate", review(GPU_POD))
    assert refused["response"]["allowed"] is False and refused["response"]["status"]["code"] == 403
    assert patched["response"]["patchType"] == "JSONPatch"


def test_an_update_is_never_mutated() -> None:
    old = pod(resources={names.NVIDIA_GPU: 1}, annotations={names.DEVICE_ALLOCATED: "{}"})
    _, answer = post("/mutate", review(old, operation="UPDATE", old=old))
    assert "patch" not in answer["response"]


def test_a_dry_run_create_gets_the_same_patch() -> None:
    _, real = post("/mutate", review(GPU_POD))
    _, dry = post("/mutate", review(GPU_POD, dry_run=True))
    assert real["response"]["patch"] == dry["response"]["patch"]


def test_the_namespace_of_the_request_is_the_one_the_scope_reads() -> None:
    scoped = Admission(scope=Scope(namespaces=frozenset({"ml"})), rules=lambda: RULES)
    unnamespaced = pod(resources={names.NVIDIA_GPU: 1})
    del unnamespaced["metadata"]["namespace"]
    for namespace, patched in (("ml", True), ("web", False)):
        _, _, body = scoped.handle("POST", "/mutate", json.dumps(review(unnamespaced, namespace=namespace)).encode())
        assert ("patch" in json.loads(body)["response"]) is patched


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/healthz", 200), ("GET", "/readyz", 200), ("GET", "/livez?verbose", 200), ("HEAD", "/healthz", 200),
        ("POST", "/healthz", 405), ("GET", "/mutate", 405), ("PUT", "/validate", 405), ("POST", "/convert", 404),
        ("GET", "/", 404),
    ],
)
def test_routes(method: str, path: str, status: int) -> None:
    assert handle(method, path)[0] == status
