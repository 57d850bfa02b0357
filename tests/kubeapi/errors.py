"""API errors as the real API server shapes them: a `Status` body and an HTTP code.

The official client turns any non-2xx answer into `ApiException(status=code)`
with the body attached, and callers branch on `e.status` and on the body's
`reason`; so every failure here carries both, spelled as kube-apiserver
spells them (`k8s.io/apimachinery/pkg/api/errors`).
"""

from __future__ import annotations

from typing import Any

from tests.kubeapi.resources import ResourceInfo


class ApiError(Exception):
    """A request the double answers with a `Status` object instead of a result."""

    def __init__(
        self,
        *,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(resource: ResourceInfo, name: str, **extra: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": resource.plural}
    if resource.group:
        details["group"] = resource.group
    details.update(extra)
    return details


def not_found(resource: ResourceInfo, name: str) -> ApiError:
    return ApiError(
        code=404,
        reason="NotFound",
        message=f'{resource.qualified} "{name}" not found',
        details=_details(resource, name),
    )


def already_exists(resource: ResourceInfo, name: str) -> ApiError:
    return ApiError(
        code=409,
        reason="AlreadyExists",
        message=f'{resource.qualified} "{name}" already exists',
        details=_details(resource, name),
    )


def conflict(resource: ResourceInfo, name: str, why: str) -> ApiError:
    return ApiError(
        code=409,
        reason="Conflict",
        message=f'Operation cannot be fulfilled on {resource.qualified} "{name}": {why}',
        details=_details(resource, name),
    )


def stale(resource: ResourceInfo, name: str) -> ApiError:
    return conflict(
        resource,
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )


def invalid(resource: ResourceInfo, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 with one cause per (field, problem), as admission and validation report them."""
    text = "; ".join(f"{field}: {problem}" for field, problem in causes)
    return ApiError(
        code=422,
        reason="Invalid",
        message=f'{resource.kind} "{name}" is invalid: {text}',
        details=_details(
            resource,
            name,
            kind=resource.kind,
            causes=[{"reason": "FieldValueInvalid", "message": p, "field": f} for f, p in causes],
        ),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(code=400, reason="BadRequest", message=message)


def gone(message: str) -> ApiError:
    return ApiError(code=410, reason="Expired", message=message)


def method_not_allowed(message: str) -> ApiError:
    return ApiError(code=405, reason="MethodNotAllowed", message=message)


def unsupported_media_type(content_type: str, allowed: list[str]) -> ApiError:
    return ApiError(
        code=415,
        reason="UnsupportedMediaType",
        message=f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(allowed)} (got {content_type!r})",
    )


def path_not_found(path: str) -> ApiError:
    return ApiError(
        code=404, reason="NotFound", message=f"the server could not find the requested resource ({path})"
    )


def injected(code: int) -> ApiError:
    """The failure `KubeAPIServer.fail_next` asked for."""
    reason = {500: "InternalError", 503: "ServiceUnavailable", 429: "TooManyRequests", 504: "Timeout"}
    return ApiError(
        code=code,
        reason=reason.get(code, "InternalError"),
        message=f"injected failure {code} (KubeAPIServer.fail_next)",
    )
