"""The mutating decision: what fgpu changes in a pod being created, as a JSONPatch with warnings.

Two changes, and nothing else:

1. A pod that asks for GPU resources (Koordinator's, or any a translation rule
   maps, apis/pod_check.py) and names no scheduler (no spec.schedulerName, or
   the API server's default "default-scheduler") gets fgpu-scheduler, when the
   scope covers it (webhook/scope.py). A pod that names any other scheduler
   keeps it.
2. A pod created with the allocation, its signature or its node in its
   annotations loses them, in every namespace and whatever the scope: only
   fgpu-scheduler writes them, when it places the pod. Such pods come from a
   manifest copied off a running pod, or a restored backup; without this, the
   ValidatingAdmissionPolicy that guards the keys would refuse them
   (hack/deploy/40-scheduler-owns-allocations.yaml).

Example: a Deployment's pod asking for `koordinator.sh/gpu-core: 50` gets::

    [{"op": "replace", "path": "/spec/schedulerName", "value": "fgpu-scheduler"}]

with the warning "fgpu: set spec.schedulerName to fgpu-scheduler (was
default-scheduler): the pod asks for koordinator.sh/gpu-core; ...".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apis import names
from apis.translation import TranslationRules
from webhook import patches
from webhook.reading import DIRECT, PodReader
from webhook.review import Verdict
from webhook.scope import Scope, injects, pod_labels

#: Annotations only fgpu-scheduler writes.
SCHEDULER_ANNOTATIONS = (names.DEVICE_ALLOCATED, names.ALLOCATION_SIGNATURE, names.ALLOCATION_NODE)


def mutate_pod(
    pod: Mapping[str, Any],
    *,
    namespace: str,
    scope: Scope,
    rules: TranslationRules,
    reader: PodReader = DIRECT,
) -> Verdict:
    """The patch and warnings for a pod being created (allowed, always)."""
    ops: list[patches.Operation] = []
    warnings: list[str] = []
    _strip_annotations(pod, ops, warnings)
    _inject_scheduler(pod, namespace=namespace, scope=scope, rules=rules, reader=reader, ops=ops, warnings=warnings)
    return Verdict(allowed=True, patch=tuple(ops), warnings=tuple(warnings))


def names_no_scheduler(pod: Mapping[str, Any]) -> bool:
    """True when the pod leaves the choice of scheduler to Kubernetes."""
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name in (None, "", names.DEFAULT_SCHEDULER_NAME)


def _strip_annotations(pod: Mapping[str, Any], ops: list[patches.Operation], warnings: list[str]) -> None:
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping):
        return
    for key in SCHEDULER_ANNOTATIONS:
        if key in annotations:
            ops.append(patches.remove(patches.pointer("metadata", "annotations", key)))
            warnings.append(f"fgpu: removed annotation {key}: only {names.SCHEDULER_NAME} sets it, when it places the pod")


def _inject_scheduler(
    pod: Mapping[str, Any],
    *,
    namespace: str,
    scope: Scope,
    rules: TranslationRules,
    reader: PodReader,
    ops: list[patches.Operation],
    warnings: list[str],
) -> None:
    if not names_no_scheduler(pod):
        return
    if injects(scope, namespace=namespace, labels=pod_labels(pod)) is not None:
        return
    asks_for = reader.gpu_resources(pod, rules=rules)
    if not asks_for:
        return
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return
    path = patches.pointer("spec", "schedulerName")
    was = spec.get("schedulerName")
    if was is None:
        ops.append(patches.add(path, names.SCHEDULER_NAME))
    else:
        ops.append(patches.replace(path, names.SCHEDULER_NAME))
    warnings.append(
        f"fgpu: set spec.schedulerName to {names.SCHEDULER_NAME} (was {was or 'unset'}): the pod asks for "
        f"{_short_list(asks_for)}; label it {names.SCHEDULER_INJECTION_LABEL}={names.SCHEDULER_INJECTION_OPT_OUT} "
        "to keep the default scheduler"
    )


def _short_list(items: Sequence[str], *, limit: int = 2) -> str:
    """"a, b and 2 more": a warning stays under the 256 characters the API server passes on whole."""
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"
