"""The AdmissionReview v1 envelope: what the API server sends, and the answer it expects.

A request, as the API server sends it (trimmed)::

    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
     "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                 "kind": {"group": "", "version": "v1", "kind": "Pod"},
                 "resource": {"group": "", "version": "v1", "resource": "pods"},
                 "namespace": "ml", "operation": "CREATE", "dryRun": false,
                 "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                 "object": {"apiVersion": "v1", "kind": "Pod", ...}, "oldObject": null}}

The answer echoes the uid; a patch is a base64 JSONPatch (RFC 6902)::

    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
     "response": {"uid": "705ab4f5-...", "allowed": true, "patchType": "JSONPatch",
                  "patch": "W3sib3AiOiAicmVwbGFjZSIsIC4uLn1d",
                  "warnings": ["fgpu: set spec.schedulerName to fgpu-scheduler, ..."]}}

A refusal carries a status (`code` is what the API server answers its client)::

    {"response": {"uid": "...", "allowed": false,
                  "status": {"code": 403, "reason": "Forbidden", "message": "container \\"main\\": ..."}}}

`decode` raises ReviewError when the body is not such a review. Without a
uid to answer to, the HTTP adapter answers 400 and the API server applies the
webhook's failurePolicy; with one, the answer is a refusal with code 400 that
says what is wrong. A readable review the webhook cannot judge (not a Pod) is
refused the same way (`Verdict.deny`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.errors import ReviewError

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


@dataclass(frozen=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str

    def __str__(self) -> str:
        return f"{self.group + '/' if self.group else ''}{self.version} {self.kind}"


#: The only object the webhook judges.
POD = GroupVersionKind(group="", version="v1", kind="Pod")


@dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    kind: GroupVersionKind
    #: "pods"; with `sub_resource` "status", "binding", ... for writes to a subresource
    resource: str
    sub_resource: str
    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    namespace: str
    name: str
    #: The object as it will be stored (CREATE, UPDATE); None for DELETE.
    object: Mapping[str, Any] | None
    #: The stored object an UPDATE or DELETE changes.
    old_object: Mapping[str, Any] | None
    dry_run: bool
    username: str


@dataclass(frozen=True)
class Verdict:
    """One webhook's answer: allowed (perhaps with a patch and warnings) or refused with a status."""

    allowed: bool = True
    #: JSONPatch operations (RFC 6902), applied in order.
    patch: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    #: On a refusal: the HTTP status the API server answers its client, the reason word, the message.
    code: int = 0
    reason: str = ""
    message: str = ""

    @classmethod
    def deny(cls, message: str, *, code: int, reason: str) -> Verdict:
        return cls(allowed=False, code=code, reason=reason, message=message)


def decode(body: bytes) -> AdmissionRequest:
    """The request inside an AdmissionReview v1; raises ReviewError naming what is wrong."""
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ReviewError(f"the body is not JSON ({_short(exc)}); send an AdmissionReview v1") from None
    if not isinstance(review, dict):
        raise ReviewError(f"the body is a JSON {type(review).__name__}, not an AdmissionReview object")
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if api_version != API_VERSION or kind != KIND:
        raise ReviewError(
            f"apiVersion {api_version!r}, kind {kind!r}: only {API_VERSION} {KIND} is served; "
            "set admissionReviewVersions: [v1] in the webhook configuration"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("the AdmissionReview has no request object; the API server always sends one")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid is missing; it must be echoed in the response")
    operation = request.get("operation")
    if not isinstance(operation, str) or not operation:
        raise ReviewError(f"request.operation {operation!r} is not CREATE, UPDATE, DELETE or CONNECT", uid=uid)
    resource = _mapping(request.get("resource"))
    return AdmissionRequest(
        uid=uid,
        kind=_gvk(request.get("kind"), uid),
        resource=str(resource.get("resource") or ""),
        sub_resource=str(request.get("subResource") or ""),
        operation=operation,
        namespace=str(request.get("namespace") or ""),
        name=str(request.get("name") or ""),
        object=_object(request, "object", uid),
        old_object=_object(request, "oldObject", uid),
        dry_run=request.get("dryRun") is True,
        username=str(_mapping(request.get("userInfo")).get("username") or ""),
    )


def encode(uid: str, verdict: Verdict) -> bytes:
    """The AdmissionReview v1 answering request `uid`."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode("ascii")
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    if not verdict.allowed:
        response["status"] = {"code": verdict.code, "reason": verdict.reason, "message": verdict.message}
    return json.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": response}).encode()


def decode_patch(encoded: str) -> list[Mapping[str, Any]]:
    """The JSONPatch of a response (for tests and tools)."""
    ops = json.loads(base64.b64decode(encoded))
    if not isinstance(ops, list):
        raise ValueError("a JSONPatch is a list of operations")
    return ops


def _gvk(raw: object, uid: str) -> GroupVersionKind:
    if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str):
        raise ReviewError(f"request.kind {str(raw)[:80]!r} is not a group/version/kind object", uid=uid)
    return GroupVersionKind(group=str(raw.get("group") or ""), version=str(raw.get("version") or ""), kind=raw["kind"])


def _object(request: Mapping[str, Any], key: str, uid: str) -> Mapping[str, Any] | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ReviewError(f"request.{key} is a JSON {type(value).__name__}, not an object", uid=uid)
    return value


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _short(exc: BaseException) -> str:
    return type(exc).__name__ if isinstance(exc, RecursionError) else str(exc)[:120]

