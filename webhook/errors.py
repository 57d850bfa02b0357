"""The webhook's exceptions, and the one place that maps them to HTTP statuses."""

from __future__ import annotations


class WebhookError(Exception):
    """Base of the webhook's own errors; the message names the input, the value and the fix."""


class ConfigError(WebhookError, ValueError):
    """A config file or flag that cannot be used."""


class CertificateError(WebhookError, ValueError):
    """A serving certificate or key that cannot be loaded."""


class ReviewError(WebhookError, ValueError):
    """A body that is not a usable AdmissionReview v1.

    `uid` is the request's, when the body got far enough to name it: the answer
    is then an AdmissionReview refusal rather than a bare HTTP error.
    """

    def __init__(self, message: str, *, uid: str = "") -> None:
        super().__init__(message)
        self.uid = uid


#: exception -> HTTP status of a bare (non-AdmissionReview) answer
_HTTP: tuple[tuple[type[BaseException], int], ...] = ((ReviewError, 400),)


def http_status(exc: BaseException) -> int:
    for kind, status in _HTTP:
        if isinstance(exc, kind):
            return status
    return 500
