"""What the API server would do to an object under the Device CRD's structural schema.

A structural schema rejects wrong types and silently prunes fields it does not
declare. Tests use both checks, so a field the agent writes but the schema
would drop is caught here rather than as missing data in a cluster.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

CRD_PATH = Path(__file__).resolve().parents[2] / "hack" / "deploy" / "crds" / "device.yaml"


def load_crd() -> dict[str, Any]:
    with CRD_PATH.open() as f:
        crd: dict[str, Any] = yaml.safe_load(f)
    return crd


@functools.cache
def device_schema() -> dict[str, Any]:
    (version,) = load_crd()["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def validation_errors(obj: Mapping[str, Any]) -> list[str]:
    """Type, required-field and pattern violations, as "path: message"."""
    validator = _validator()
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def pruned_paths(obj: object, schema: Mapping[str, Any] | None = None, path: str = "") -> list[str]:
    """Paths of fields the API server would drop because the schema does not declare them."""
    schema = device_schema() if schema is None else schema
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, Mapping):
        if path == "/metadata":
            return []  # ObjectMeta is validated by the server itself, never pruned by the CRD.
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        found: list[str] = []
        for key, value in obj.items():
            sub = f"{path}/{key}"
            if props is not None and key in props:
                found += pruned_paths(value, props[key], sub)
            elif isinstance(extra, Mapping):
                found += pruned_paths(value, extra, sub)
            else:
                found.append(sub)
        return found
    if isinstance(obj, list):
        items = schema.get("items", {})
        return [p for i, v in enumerate(obj) for p in pruned_paths(v, items, f"{path}/{i}")]
    return []


@functools.cache
def _validator() -> Any:
    return jsonschema.Draft7Validator(device_schema())
