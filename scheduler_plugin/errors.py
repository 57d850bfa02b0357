"""The scheduler service's exceptions, and the one place that maps them to gRPC and HTTP codes.

Adapters (gRPC servicer, HTTP extender) never pick a status code themselves:
they catch `ServiceError` (and the few library errors a pod can cause) and
ask `grpc_code` / `http_status` here.
"""

from __future__ import annotations

import grpc

from apis.allocation import AllocationError
from apis.request import RequestError
from apis.signing import SignatureError


class ServiceError(Exception):
    """Base of every error the service reports to a caller."""


class InvalidRequest(ServiceError):
    """The caller's input is malformed (bad JSON, a missing field, an invalid pod request)."""


class NotFound(ServiceError):
    """A named pod or node does not exist."""


class Unschedulable(ServiceError):
    """The pod does not fit on the node (any more); retrying after other pods leave may help."""


class Conflict(ServiceError):
    """The pod was changed or bound by someone else meanwhile."""


class BindFailed(ServiceError):
    """The bind did not happen (and what it wrote was undone); retrying may succeed."""


class Refused(ServiceError):
    """This scheduler does not take the call in its configuration, whoever asks (e.g. ReportDevices
    with the kubernetes backend, where only Device objects describe a node)."""


class NotLeader(ServiceError):
    """This instance is a standby; only the leader binds pods."""


class Unavailable(ServiceError):
    """A dependency (the Kubernetes API, the state store) failed or is not loaded yet; retry."""


class KubeAPIError(Unavailable):
    """A Kubernetes API call failed. `status` is the HTTP status (0 when no response came)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class WatchExpired(KubeAPIError):
    """The watch's resourceVersion is too old (410 Gone); list again."""


_GRPC: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (RequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (AllocationError, grpc.StatusCode.INVALID_ARGUMENT),
    (SignatureError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Unschedulable, grpc.StatusCode.FAILED_PRECONDITION),
    (Refused, grpc.StatusCode.PERMISSION_DENIED),
    (Conflict, grpc.StatusCode.ABORTED),
    (NotLeader, grpc.StatusCode.UNAVAILABLE),
    (BindFailed, grpc.StatusCode.UNAVAILABLE),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
)

_HTTP: tuple[tuple[type[BaseException], int], ...] = (
    (InvalidRequest, 400),
    (RequestError, 400),
    (AllocationError, 400),
    (SignatureError, 400),
    (NotFound, 404),
    (Unschedulable, 409),
    (Refused, 403),
    (Conflict, 409),
    (NotLeader, 503),
    (BindFailed, 503),
    (Unavailable, 503),
)


def grpc_code(exc: BaseException) -> grpc.StatusCode:
    for kind, code in _GRPC:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def http_status(exc: BaseException) -> int:
    for kind, status in _HTTP:
        if isinstance(exc, kind):
            return status
    return 500


def describe(exc: BaseException) -> str:
    """The message a caller sees: the exception's own text, all of a RequestError's lines."""
    errors = getattr(exc, "errors", None)
    if isinstance(errors, list) and errors:
        return "; ".join(str(e) for e in errors)
    return str(exc) or type(exc).__name__
