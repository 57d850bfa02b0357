"""Node labels as per-key code arrays, so nodeSelector and node affinity match all nodes at once.

For each label key a pod asks about, the index keeps one integer per node slot:
the code of the node's value for that key, or -1 when the node lacks the label.
Matching a requirement is then a comparison over that array. Arrays are built
on first use of a key and kept current as node labels change.

Semantics are Kubernetes' (NodeSelectorRequirement): In, NotIn, Exists,
DoesNotExist, Gt, Lt; NotIn and DoesNotExist match a node without the label;
Gt/Lt compare integers and never match a non-integer value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from scheduler_plugin.core.api import LabelRequirement

_ABSENT = -1
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")

Codes = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


class LabelIndex:
    def __init__(self) -> None:
        self._labels: dict[int, Mapping[str, str]] = {}
        self._codes: dict[str, Codes] = {}
        self._values: dict[str, dict[str, int]] = {}
        self._capacity = 0

    def set_labels(self, slot: int, labels: Mapping[str, str]) -> None:
        old = self._labels.get(slot, {})
        if old == labels:
            return
        self._labels[slot] = dict(labels)
        self._ensure_capacity(slot + 1)
        for key in set(old) | set(labels):
            codes = self._codes.get(key)
            if codes is not None:
                value = labels.get(key)
                codes[slot] = _ABSENT if value is None else self._code(key, value)

    def clear(self, slot: int) -> None:
        self.set_labels(slot, {})
        self._labels.pop(slot, None)

    def labels_of(self, slot: int) -> Mapping[str, str]:
        return self._labels.get(slot, {})

    def match(
        self,
        slots: npt.NDArray[np.intp],
        *,
        selector: Mapping[str, str],
        terms: Sequence[Sequence[LabelRequirement]],
    ) -> Mask:
        """Nodes matching the nodeSelector and (if any) at least one affinity term."""
        result: Mask = np.ones(len(slots), dtype=np.bool_)
        for key, value in selector.items():
            result &= self._column(key, slots) == self._values.get(key, {}).get(value, -2)
        if terms:
            any_term = np.zeros(len(slots), dtype=np.bool_)
            for term in terms:
                if not term:
                    continue  # an empty term matches no node (Kubernetes semantics)
                term_ok: Mask = np.ones(len(slots), dtype=np.bool_)
                for requirement in term:
                    term_ok &= self._requirement(requirement, slots)
                any_term |= term_ok
            result &= any_term
        return result

    def _requirement(self, requirement: LabelRequirement, slots: npt.NDArray[np.intp]) -> Mask:
        column = self._column(requirement.key, slots)
        present: Mask = column != _ABSENT
        operator = requirement.operator
        if operator == "Exists":
            return present
        if operator == "DoesNotExist":
            absent: Mask = ~present
            return absent
        known = self._values.get(requirement.key, {})
        if operator in ("In", "NotIn"):
            wanted = [known[v] for v in requirement.values if v in known]
            inside: Mask = np.isin(column, wanted) if wanted else np.zeros(len(slots), dtype=np.bool_)
            return inside if operator == "In" else ~inside
        if operator in ("Gt", "Lt"):
            bound = _as_int(requirement.values[0]) if requirement.values else None
            if bound is None:
                return np.zeros(len(slots), dtype=np.bool_)
            table = np.zeros(len(known) + 1, dtype=np.bool_)  # last entry: absent
            for value, code in known.items():
                number = _as_int(value)
                if number is not None:
                    table[code] = number > bound if operator == "Gt" else number < bound
            return table[np.where(present, column, len(known))]
        raise ValueError(f"node affinity operator {operator!r} is not one of {', '.join(OPERATORS)}")

    def _column(self, key: str, slots: npt.NDArray[np.intp]) -> Codes:
        codes = self._codes.get(key)
        if codes is None:
            codes = np.full(self._capacity, _ABSENT, dtype=np.int64)
            for slot, labels in self._labels.items():
                value = labels.get(key)
                if value is not None:
                    codes[slot] = self._code(key, value)
            self._codes[key] = codes
        if len(codes) < self._capacity:
            codes = self._codes[key] = np.concatenate(
                [codes, np.full(self._capacity - len(codes), _ABSENT, dtype=np.int64)]
            )
        in_range = slots < len(codes)
        if in_range.all():
            return codes[slots]
        return np.where(in_range, codes[np.minimum(slots, max(len(codes) - 1, 0))], _ABSENT)

    def _code(self, key: str, value: str) -> int:
        values = self._values.setdefault(key, {})
        return values.setdefault(value, len(values))

    def _ensure_capacity(self, size: int) -> None:
        if size <= self._capacity:
            return
        capacity = max(size, self._capacity * 2, 64)
        for key, codes in self._codes.items():
            self._codes[key] = np.concatenate(
                [codes, np.full(capacity - len(codes), _ABSENT, dtype=np.int64)]
            )
        self._capacity = capacity


def _as_int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def values_problem(operator: str, values: Sequence[str]) -> str | None:
    """Why `values` don't suit `operator` under Kubernetes' rules, or None when they do."""
    if operator in ("In", "NotIn") and not values:
        return f"operator {operator} needs at least one value"
    if operator in ("Exists", "DoesNotExist") and values:
        return f"operator {operator} takes no values, got {list(values)}"
    if operator in ("Gt", "Lt") and (len(values) != 1 or _as_int(values[0]) is None):
        return f"operator {operator} needs exactly one integer value, got {list(values)}"
    return None


def matches(labels: Mapping[str, str], requirement: LabelRequirement) -> bool:
    """One requirement against one node's labels (used to explain a mismatch)."""
    value = labels.get(requirement.key)
    operator = requirement.operator
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator == "In":
        return value is not None and value in requirement.values
    if operator == "NotIn":
        return value is None or value not in requirement.values
    if value is None or not requirement.values:
        return False
    number, bound = _as_int(value), _as_int(requirement.values[0])
    if number is None or bound is None:
        return False
    return number > bound if operator == "Gt" else number < bound
