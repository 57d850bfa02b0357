"""Label and field selectors, parsed and matched as `k8s.io/apimachinery/pkg/labels` and `fields` do.

Label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`,
`!k`, `k>1`, `k<1`. Field selectors: `f=v`, `f==v`, `f!=v` over the field
labels the resource declares; an undeclared field is a 400, as for real.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.kubeapi import errors

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*$")
_CMP_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|!=|=|>|<)\s*(?P<value>[^=!<>\s]*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


class Op(enum.Enum):
    EQUALS = enum.auto()
    NOT_EQUALS = enum.auto()
    IN = enum.auto()
    NOT_IN = enum.auto()
    EXISTS = enum.auto()
    DOES_NOT_EXIST = enum.auto()
    GREATER = enum.auto()
    LESS = enum.auto()


@dataclass(frozen=True)
class Requirement:
    key: str
    op: Op
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case Op.EXISTS:
                return present
            case Op.DOES_NOT_EXIST:
                return not present
            case Op.EQUALS | Op.IN:
                return present and value in self.values
            case Op.NOT_EQUALS | Op.NOT_IN:
                return not present or value not in self.values
            case Op.GREATER | Op.LESS:
                if not present or value is None:
                    return False
                try:
                    number = int(value)
                except ValueError:
                    return False
                limit = int(self.values[0])
                return number > limit if self.op is Op.GREATER else number < limit


@dataclass(frozen=True)
class Selector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, values: Mapping[str, str]) -> bool:
        return all(r.matches(values) for r in self.requirements)


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def parse_labels(text: str | None) -> Selector:
    if not text:
        return Selector()
    requirements = []
    for part in _split_top_level(text):
        if m := _SET_RE.match(part):
            values = tuple(v.strip() for v in m["values"].split(",") if v.strip())
            requirements.append(Requirement(m["key"], Op.IN if m["op"] == "in" else Op.NOT_IN, values))
        elif m := _CMP_RE.match(part):
            op = {"=": Op.EQUALS, "==": Op.EQUALS, "!=": Op.NOT_EQUALS, ">": Op.GREATER, "<": Op.LESS}[
                m["op"]
            ]
            if op in (Op.GREATER, Op.LESS) and not re.fullmatch(r"-?\d+", m["value"]):
                raise errors.bad_request(
                    f"unable to parse requirement: {part.strip()!r}: for 'gt', 'lt' operators, "
                    "the value must be an integer"
                )
            requirements.append(Requirement(m["key"], op, (m["value"],)))
        elif m := _EXISTS_RE.match(part):
            requirements.append(Requirement(m["key"], Op.DOES_NOT_EXIST if m["neg"] else Op.EXISTS))
        else:
            raise errors.bad_request(
                f"unable to parse requirement: {part.strip()!r} in labelSelector {text!r}: "
                "use key=value, key!=value, key in (a,b), key notin (a,b), key or !key"
            )
    return Selector(tuple(requirements))


def parse_fields(text: str | None, *, allowed: frozenset[str], kind: str) -> Selector:
    if not text:
        return Selector()
    requirements = []
    for part in _split_top_level(text):
        m = re.fullmatch(r"\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*", part)
        if m is None:
            raise errors.bad_request(
                f"invalid selector: {part.strip()!r} in fieldSelector {text!r}: use field=value or field!=value"
            )
        if m[1] not in allowed:
            raise errors.bad_request(
                f"field label not supported: {m[1]} (kind {kind} supports: {', '.join(sorted(allowed))})"
            )
        requirements.append(Requirement(m[1], Op.NOT_EQUALS if m[2] == "!=" else Op.EQUALS, (m[3],)))
    return Selector(tuple(requirements))


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares against: absent is "", booleans are "true"/"false"."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def object_matcher(labels: Selector, fields: Selector) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate over stored objects, for list and for each watch event."""
    keys = [r.key for r in fields.requirements]

    def matches(obj: Mapping[str, Any]) -> bool:
        if not labels.matches(obj.get("metadata", {}).get("labels") or {}):
            return False
        return fields.matches({key: field_value(obj, key) for key in keys})

    return matches
