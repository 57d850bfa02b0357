"""The framework around the two decisions: routes, the AdmissionReview envelope, operations.

`Admission.handle(method, path, body)` is the whole webhook as a function
from an HTTP request to (status, content type, body), with no sockets, so the
HTTP server (webhook/httpserver.py) stays a thin adapter and tests can call it
directly.

- `POST /mutate`: on CREATE of a Pod, the patch of webhook/mutating.py; on
  anything else (UPDATE, DELETE, CONNECT) allowed, unchanged.
- `POST /validate`: on CREATE, the verdict of webhook/validating.py; on UPDATE
  the same, but only when the update changes the pod's resources (on a real
  cluster it never does: they are immutable); DELETE, CONNECT allowed.
- A write to a pod subresource (pods/status, pods/binding, pods/eviction,
  ...) is allowed, unchanged, whatever its kind (Binding, policy/v1
  Eviction, ...): the webhook judges pods as they are created.
- A review for any other kind is refused with code 400, saying that the
  webhook configuration's rules should list pods only.
- `dryRun` changes nothing: the webhook has no side effects, so a dry run gets
  the answer the real request would (the configuration declares
  `sideEffects: None`).
- `GET /healthz` (and /readyz, /livez): 200 "ok" while serving.

A body that is not an AdmissionReview v1 gets 400 with a plain-text reason,
or, once its uid is known, a refusal with code 400 (webhook/review.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from apis import names
from apis.translation import TranslationRules
from webhook import errors, review
from webhook.mutating import mutate_pod
from webhook.reading import MemoReader, PodReader
from webhook.review import POD, AdmissionRequest, Verdict
from webhook.scope import Scope
from webhook.validating import resources_changed, validate_pod

log = logging.getLogger(__name__)

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
HEALTH_PATHS = ("/healthz", "/readyz", "/livez")

#: (method, path, body) -> (status, content type, body): what webhook/httpserver.py serves
Response = tuple[int, str, bytes]


class Admission:
    """The webhook's requests, answered; `rules` is asked for the current translation rules each time."""

    def __init__(self, *, scope: Scope, rules: Callable[[], TranslationRules], reader: PodReader | None = None) -> None:
        self._scope = scope
        self._rules = rules
        self._reader: PodReader = reader if reader is not None else MemoReader()
        self._routes: Mapping[str, Callable[[AdmissionRequest], Verdict]] = {
            names.WEBHOOK_MUTATE_PATH: self._mutate,
            names.WEBHOOK_VALIDATE_PATH: self._validate,
        }

    def handle(self, method: str, path: str, body: bytes) -> Response:
        route = path.partition("?")[0]  # the API server adds ?timeout=10s
        if route in HEALTH_PATHS:
            if method not in ("GET", "HEAD"):
                return 405, TEXT, f"{route}: use GET".encode()
            return 200, TEXT, b"ok"
        decide = self._routes.get(route)
        if decide is None:
            return 404, TEXT, (
                f"{route}: not found; AdmissionReview v1 is served on POST {names.WEBHOOK_MUTATE_PATH} "
                f"and POST {names.WEBHOOK_VALIDATE_PATH}"
            ).encode()
        if method != "POST":
            return 405, TEXT, f"{route}: POST an AdmissionReview v1".encode()
        try:
            request = review.decode(body)
        except errors.ReviewError as exc:
            if not exc.uid:
                return errors.http_status(exc), TEXT, str(exc).encode()
            return 200, JSON, review.encode(exc.uid, Verdict.deny(str(exc), code=400, reason="BadRequest"))
        verdict = self._judge(request, decide)
        return 200, JSON, review.encode(request.uid, verdict)

    def _judge(self, request: AdmissionRequest, decide: Callable[[AdmissionRequest], Verdict]) -> Verdict:
        if request.sub_resource and request.resource in ("", "pods"):
            # Before the kind check: the API server sends a subresource write with the subresource's
            # own kind (pods/binding: v1 Binding, pods/eviction: policy/v1 Eviction), and refusing
            # one would stop every bind under failurePolicy Fail. The answer is a bare "allowed", as
            # for every other request the webhook does not judge.
            log.debug("%s %s/%s (%s) by %s: allowed, subresource %s is not judged", request.operation,
                      request.namespace, request.name, request.kind, request.username, request.sub_resource)
            return Verdict()
        if request.kind != POD or request.resource not in ("", "pods"):
            return Verdict.deny(
                f"fgpu-webhook admits v1 Pods only, not {request.kind} ({request.resource or 'no resource'}); "
                "list only pods in the webhook configuration's rules",
                code=400, reason="BadRequest",
            )
        verdict = decide(request)
        if (not verdict.allowed or verdict.patch) and log.isEnabledFor(logging.DEBUG):
            # Debug: a controller retrying a refused pod must not flood the log; the API server's
            # audit log records every patch and refusal.
            log.debug(
                "%s %s/%s by %s%s: %s", request.operation, request.namespace, request.name or _generate_name(request),
                request.username, " (dry run)" if request.dry_run else "",
                verdict.message if not verdict.allowed else "; ".join(verdict.warnings),
            )
        return verdict

    def _mutate(self, request: AdmissionRequest) -> Verdict:
        if request.operation != "CREATE" or request.object is None:
            return Verdict()
        return mutate_pod(request.object, namespace=_namespace(request), scope=self._scope, rules=self._rules(),
                          reader=self._reader)

    def _validate(self, request: AdmissionRequest) -> Verdict:
        pod = request.object
        if pod is None or request.operation not in ("CREATE", "UPDATE"):
            return Verdict()
        if request.operation == "UPDATE" and request.old_object is not None and not resources_changed(request.old_object, pod):
            return Verdict()
        return validate_pod(pod, namespace=_namespace(request), scope=self._scope, rules=self._rules(),
                            reader=self._reader)


def _namespace(request: AdmissionRequest) -> str:
    """The request's namespace (authoritative); the object's, else "default", for hand-made reviews."""
    if request.namespace:
        return request.namespace
    meta = request.object.get("metadata") if request.object is not None else None
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    return str(namespace or "default")


def _generate_name(request: AdmissionRequest) -> str:
    meta: Any = request.object.get("metadata") if request.object is not None else None
    return str(meta.get("generateName") or "") + "*" if isinstance(meta, Mapping) else "?"
