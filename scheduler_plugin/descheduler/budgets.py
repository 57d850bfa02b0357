"""Which PodDisruptionBudgets cover a pod, and how many disruptions each allows now (pure).

The planner is told what each budget allows so it proposes only moves the API server would accept;
the Eviction API stays the judge (a budget that changed since the read answers 429 and the
evictor stops the plan). As the API server: a null selector selects nothing, an empty one every
pod of the namespace, and a budget whose status lags its generation allows nothing yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _name(pdb: Mapping[str, Any]) -> str:
    meta = pdb.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, Any]) -> bool:
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # unknown: select nothing rather than guess
    return True


def covering(pdbs: Sequence[Mapping[str, Any]], pod: Mapping[str, Any]) -> tuple[str, ...]:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return tuple(
        _name(pdb)
        for pdb in pdbs
        if (pdb.get("metadata") or {}).get("namespace") == meta.get("namespace")
        and selects((pdb.get("spec") or {}).get("selector"), labels)
    )


def allowances(pdbs: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    result: dict[str, int] = {}
    for pdb in pdbs:
        status = pdb.get("status") or {}
        generation = int((pdb.get("metadata") or {}).get("generation") or 1)
        if int(status.get("observedGeneration") or 0) < generation:
            result[_name(pdb)] = 0
            continue
        result[_name(pdb)] = max(0, int(status.get("disruptionsAllowed") or 0))
    return result
