"""Structural-schema pruning and validation of custom resources, as apiextensions does.

Defaults declared in the schema are filled in. Pruning drops fields the CRD's openAPIV3Schema does not declare (unless
`x-kubernetes-preserve-unknown-fields`), silently, as the real server does;
it is why fgpu keeps its Device extras in an annotation. Validation covers
`type`, `nullable`, `required`, `enum`, `minimum`/`maximum`, `pattern` and
`x-kubernetes-int-or-string`, enough to turn a wrong payload into the same
422 a cluster would give.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

_ROOT_KEEP = ("apiVersion", "kind", "metadata")


def prune(obj: dict[str, Any], schema: Mapping[str, Any]) -> None:
    """Remove undeclared fields in place (the root's apiVersion/kind/metadata always stay)."""
    kept = {k: obj.pop(k) for k in _ROOT_KEEP if k in obj}
    _prune(obj, schema)
    obj.update(kept)


def _prune(value: Any, schema: Mapping[str, Any]) -> None:
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if schema.get("x-kubernetes-embedded-resource"):
            properties = {
                **{k: {"x-kubernetes-preserve-unknown-fields": True} for k in _ROOT_KEEP},
                **(properties or {}),
            }
        for key in list(value):
            if properties is not None and key in properties:
                _prune(value[key], properties[key])
            elif isinstance(additional, Mapping):
                _prune(value[key], additional)
            elif not (preserve or additional is True):
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _prune(item, schema["items"])


def apply_defaults(obj: dict[str, Any], schema: Mapping[str, Any]) -> None:
    """Fill absent fields that declare a `default`, in place, as the API server does on write and read."""
    _default(obj, schema)


def _default(value: Any, schema: Mapping[str, Any]) -> None:
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default(value[key], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for key in value:
                _default(value[key], additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _default(item, schema["items"])


_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def validate(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, problem) for each violation; the root's metadata is ObjectMeta's business, not the schema's."""
    causes: list[tuple[str, str]] = []
    body = {k: v for k, v in obj.items() if k != "metadata"}
    _validate(body, schema, "", causes)
    return causes


def _validate(value: Any, schema: Mapping[str, Any], path: str, causes: list[tuple[str, str]]) -> None:
    where = path or "<root>"
    if value is None:
        if not schema.get("nullable"):
            causes.append((where, 'Invalid value: "null": field is not nullable'))
        return
    expected = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            causes.append((where, f"Invalid value: {value!r}: must be an integer or a string"))
        return
    if expected in _TYPES:
        is_bool = isinstance(value, bool)
        if not isinstance(value, _TYPES[expected]) or (is_bool and expected != "boolean"):
            causes.append(
                (where, f"Invalid value: {type(value).__name__}: {where} in body must be of type {expected}")
            )
            return
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(v) for v in schema["enum"])
        causes.append((where, f"Unsupported value: {value!r}: supported values: {allowed}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            causes.append(
                (where, f"Invalid value: {value}: should be greater than or equal to {schema['minimum']}")
            )
        if "maximum" in schema and value > schema["maximum"]:
            causes.append(
                (where, f"Invalid value: {value}: should be less than or equal to {schema['maximum']}")
            )
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        causes.append((where, f"Invalid value: {value!r}: should match {schema['pattern']!r}"))
    if isinstance(value, dict):
        for name in schema.get("required") or []:
            if name not in value:
                causes.append((f"{path}.{name}" if path else name, "Required value"))
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if key in properties:
                _validate(item, properties[key], child, causes)
            elif isinstance(additional, Mapping):
                _validate(item, additional, child, causes)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            _validate(item, schema["items"], f"{where}[{index}]", causes)
