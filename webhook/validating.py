"""The validating decision: refuse a pod of fgpu's whose resources `fgpuctl validate` finds invalid.

The check is apis/pod_check.py's, the one `fgpuctl validate` prints and the
scheduler applies, so the refusal reads exactly as they do, one problem per
clause, each naming the container, the resource, the value and the fix::

    container "main": koordinator.sh/gpu-core=150: a percentage above 100 must be a multiple of 100 ...

A pod is fgpu's to judge when it names fgpu-scheduler, or when it names no
scheduler and the mutating webhook would give it fgpu-scheduler (same scope,
asks for GPUs): when the mutating webhook was down (it fails open) the pod is
still refused here. A pod that names another scheduler, or opts out, is some
other product's, and passes untouched.

Refusals carry code 403 (reason Forbidden), as the API server's own admission
plugins (ResourceQuota, PodSecurity) refuse a pod; kubectl prints
`Error from server (Forbidden): ... denied the request: <message>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis import names
from apis.pod_check import resources_fingerprint
from apis.translation import TranslationRules
from webhook.mutating import names_no_scheduler
from webhook.reading import DIRECT, PodReader
from webhook.review import Verdict
from webhook.scope import Scope, injects, pod_labels

REFUSED_CODE = 403
REFUSED_REASON = "Forbidden"


def validate_pod(
    pod: Mapping[str, Any],
    *,
    namespace: str,
    scope: Scope,
    rules: TranslationRules,
    reader: PodReader = DIRECT,
) -> Verdict:
    """Allowed, or refused with the check's message."""
    if not is_fgpus(pod, namespace=namespace, scope=scope, rules=rules, reader=reader):
        return Verdict()
    check = reader.check(pod, rules=rules)
    if check.valid:
        return Verdict()
    return Verdict.deny(check.message, code=REFUSED_CODE, reason=REFUSED_REASON)


def is_fgpus(
    pod: Mapping[str, Any], *, namespace: str, scope: Scope, rules: TranslationRules, reader: PodReader = DIRECT
) -> bool:
    """True when fgpu-scheduler places the pod, or would had the mutating webhook seen it."""
    spec = pod.get("spec")
    if isinstance(spec, Mapping) and spec.get("schedulerName") == names.SCHEDULER_NAME:
        return True
    if not names_no_scheduler(pod):
        return False
    if injects(scope, namespace=namespace, labels=pod_labels(pod)) is not None:
        return False
    return bool(reader.gpu_resources(pod, rules=rules))


def resources_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when an update changes what the check reads (containers' resources, overhead, and the
    gpu-mode, burstable and placement annotations: `resources_fingerprint`).

    Kubernetes keeps a pod's extended resources immutable (an in-place resize
    changes CPU and memory only), so on a real cluster this is False for every
    UPDATE of a GPU request: the validating webhook needs CREATE only.
    """
    return resources_fingerprint(old) != resources_fingerprint(new)
