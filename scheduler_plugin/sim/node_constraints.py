"""Node labels, node selectors and required node affinity as a snapshot's JSON spells them.

    node:  "labels": {"zone": "a", "pool": "train"}
    pod:   "node_selector": {"pool": "train"},
           "affinity": [[{"key": "zone", "operator": "In", "values": ["a", "b"]}],
                        [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]]

`affinity` is Kubernetes' requiredDuringSchedulingIgnoredDuringExecution: a pod may run on a node
matching at least one term (OR), a term matching when all its requirements do (AND); an empty
term matches no node. Operators and their values are Kubernetes' (In/NotIn: one or more values,
Exists/DoesNotExist: none, Gt/Lt: one integer). The key `metadata.name` is the node's name (a
`matchFields` requirement). The scheduler core applies them; this module only reads and writes
them, with errors that name the entry, the field, the value and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler_plugin.core.api import LabelRequirement
from scheduler_plugin.core.labels import OPERATORS, values_problem

Terms = tuple[tuple[LabelRequirement, ...], ...]

#: how to mend values that don't suit the operator
_FIXES = {
    "In": '; add "values": [..]',
    "NotIn": '; add "values": [..]',
    "Exists": '; drop "values"',
    "DoesNotExist": '; drop "values"',
}


class ConstraintError(ValueError):
    """A label map, node selector or affinity is malformed; the message says where and how to fix it."""


def labels_from_json(value: Any, *, where: str, field: str) -> dict[str, str]:
    """A string-to-string map (node labels or a node selector); absent or null is empty."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConstraintError(f"{where}: field {field!r} = {value!r} is not an object; write {{\"key\": \"value\", ...}}")
    for key, item in value.items():
        if not isinstance(key, str) or not key or not isinstance(item, str):
            raise ConstraintError(
                f"{where}: field {field!r} has {key!r}: {item!r}; keys must be non-empty strings and values strings"
            )
    return dict(value)


def affinity_from_json(value: Any, *, where: str) -> Terms:
    """Required node affinity terms; absent or null is none (the pod may run anywhere)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConstraintError(
            f"{where}: field 'affinity' = {value!r} is not a list of terms; "
            'write [[{"key": .., "operator": .., "values": [..]}, ...], ...]'
        )
    terms = []
    for t, term in enumerate(value):
        if not isinstance(term, list):
            raise ConstraintError(
                f"{where}: affinity[{t}] = {term!r} is not a list of requirements; wrap the requirement(s) in [..]"
            )
        terms.append(tuple(_requirement(entry, where=f"{where}: affinity[{t}][{r}]") for r, entry in enumerate(term)))
    return tuple(terms)


def _requirement(entry: Any, *, where: str) -> LabelRequirement:
    if not isinstance(entry, Mapping):
        raise ConstraintError(f"{where} = {entry!r} is not an object; write {{\"key\": .., \"operator\": .., \"values\": [..]}}")
    unknown = sorted(set(entry) - {"key", "operator", "values"})
    if unknown:
        raise ConstraintError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; use key, operator and values")
    key = entry.get("key")
    if not isinstance(key, str) or not key:
        raise ConstraintError(f"{where}: key = {key!r}; name the node label to match (or metadata.name)")
    operator = entry.get("operator")
    if operator not in OPERATORS:
        raise ConstraintError(f"{where}: operator = {operator!r} is not a node affinity operator; use one of {', '.join(OPERATORS)}")
    values = entry.get("values", [])
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ConstraintError(f"{where}: values = {values!r} is not a list of strings; quote each value")
    problem = values_problem(operator, values)
    if problem is not None:
        raise ConstraintError(f"{where}: {problem}{_FIXES.get(operator, '')}")
    return LabelRequirement(key=key, operator=operator, values=tuple(values))


def affinity_to_json(terms: Sequence[Sequence[LabelRequirement]]) -> list[list[dict[str, Any]]]:
    return [
        [
            {"key": r.key, "operator": r.operator, **({"values": list(r.values)} if r.values else {})}
            for r in term
        ]
        for term in terms
    ]
