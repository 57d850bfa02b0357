"""Which pods get fgpu's scheduler name: namespaces, a pod label selector and the opt-out label.

Pure values and functions; the config file builds a `Scope` (webhook/config.py).
Namespace *labels* are the webhook configuration's `namespaceSelector`: the
API server matches them before it calls the webhook (docs/webhook.md).

A selector reads as Kubernetes' metav1.LabelSelector::

    podSelector:
      matchLabels: {team: ml}
      matchExpressions:
        - {key: gpu-tier, operator: In, values: [shared, batch]}
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apis import names


class Operator(enum.Enum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator is Operator.EXISTS:
            return self.key in labels
        if self.operator is Operator.DOES_NOT_EXIST:
            return self.key not in labels
        if self.operator is Operator.IN:
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    """All requirements must hold; no requirements select everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


@dataclass(frozen=True)
class Scope:
    """Where the scheduler name is set: every pod, unless these narrow it."""

    #: Only these namespaces; empty: every namespace.
    namespaces: frozenset[str] = frozenset()
    exclude_namespaces: frozenset[str] = frozenset()
    pod_selector: LabelSelector = field(default_factory=LabelSelector)
    #: False turns injection off (annotations are still removed).
    enabled: bool = True


def injects(scope: Scope, *, namespace: str, labels: Mapping[str, str]) -> str | None:
    """None when `scope` covers a pod in `namespace` with `labels`; else why not (for logs and tests)."""
    if not scope.enabled:
        return "scheduler injection is off (schedulerInjection.enabled: false)"
    if labels.get(names.SCHEDULER_INJECTION_LABEL) == names.SCHEDULER_INJECTION_OPT_OUT:
        return f"the pod opts out ({names.SCHEDULER_INJECTION_LABEL}={names.SCHEDULER_INJECTION_OPT_OUT})"
    if scope.namespaces and namespace not in scope.namespaces:
        return f"namespace {namespace} is not in schedulerInjection.namespaces"
    if namespace in scope.exclude_namespaces:
        return f"namespace {namespace} is in schedulerInjection.excludeNamespaces"
    if not scope.pod_selector.matches(labels):
        return "the pod's labels do not match schedulerInjection.podSelector"
    return None


def pod_labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): str(v) for k, v in labels.items()}
