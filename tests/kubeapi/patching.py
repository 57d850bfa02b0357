"""The three patch types the client sends: JSON merge, strategic merge, JSON patch.

- JSON merge patch (RFC 7386): maps merge recursively, `null` deletes, lists replace.
- Strategic merge patch (`k8s.io/apimachinery/pkg/util/strategicpatch`), built-in
  kinds only: like merge patch, except the lists the Go types tag with
  `patchStrategy=merge` (table below, for the fields fgpu and its tests touch)
  merge by their `patchMergeKey`, and primitive merge lists (finalizers) take
  the union. Directives: `$patch: replace|delete` on maps and list elements,
  `$deleteFromPrimitiveList/<field>`, `$retainKeys`; `$setElementOrder/<field>`
  is accepted and ignored (order is original-then-new, as without it).
- JSON patch (RFC 6902) via the maintained `jsonpatch` library.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch  # type: ignore[import-untyped]

from tests.kubeapi import errors

_PRIMITIVE = ""  # merge key marking a primitive list merged as a set union

_OBJECT_META: dict[tuple[str, ...], str] = {
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): _PRIMITIVE,
}
_CONTAINER_LISTS = {
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
}


def _pod_table() -> dict[tuple[str, ...], str]:
    table = dict(_OBJECT_META)
    for containers in ("containers", "initContainers", "ephemeralContainers"):
        table["spec", containers] = "name"
        for field, key in _CONTAINER_LISTS.items():
            table["spec", containers, field] = key
    table["spec", "volumes"] = "name"
    table["spec", "imagePullSecrets"] = "name"
    table["status", "conditions"] = "type"
    table["status", "podIPs"] = "ip"
    table["status", "hostIPs"] = "ip"
    return table


#: kind -> path of a list (field names, list levels elided) -> patchMergeKey.
MERGE_KEYS: dict[str, dict[tuple[str, ...], str]] = {
    "Pod": _pod_table(),
    "Node": {**_OBJECT_META, ("status", "conditions"): "type", ("status", "addresses"): "type"},
    "Namespace": {**_OBJECT_META, ("status", "conditions"): "type"},
}


class PatchError(ValueError):
    """A patch that cannot be applied; the message says which part and why."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Mapping[str, Any], patch: Any, *, kind: str) -> dict[str, Any]:
    if not isinstance(patch, Mapping):
        raise PatchError(f"a strategic merge patch must be a JSON object, got {type(patch).__name__}")
    table = MERGE_KEYS.get(kind, _OBJECT_META)
    merged = _smp_map(dict(copy.deepcopy(target)), patch, (), table)
    return merged if merged is not None else {}


def _smp_map(
    original: dict[str, Any],
    patch: Mapping[str, Any],
    path: tuple[str, ...],
    table: Mapping[tuple[str, ...], str],
) -> dict[str, Any] | None:
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive is not None:
        raise PatchError(f"unknown $patch directive {directive!r} at {'.'.join(path) or 'the root'}")
    result = original
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise PatchError(f"{key} must be a list")
            if isinstance(result.get(field), list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if key.startswith("$setElementOrder/") or key in ("$patch", "$retainKeys"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        child_path = (*path, key)
        current = result.get(key)
        if isinstance(value, Mapping):
            merged = _smp_map(dict(current) if isinstance(current, Mapping) else {}, value, child_path, table)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and child_path in table:
            result[key] = _smp_list(current if isinstance(current, list) else [], value, child_path, table)
        else:
            result[key] = copy.deepcopy(value)
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _smp_list(
    original: list[Any], patch: list[Any], path: tuple[str, ...], table: Mapping[tuple[str, ...], str]
) -> list[Any]:
    key = table[path]
    if key == _PRIMITIVE:
        return original + [item for item in patch if item not in original]
    result = [copy.deepcopy(item) for item in original]
    plain = []
    for item in patch:
        if not isinstance(item, Mapping):
            raise PatchError(
                f"{'.'.join(path)} merges by {key!r}; its elements must be objects, got {item!r}"
            )
        directive = item.get("$patch")
        if directive == "replace":
            return [copy.deepcopy(i) for i in patch if not (isinstance(i, Mapping) and "$patch" in i)]
        if directive == "delete":
            if key not in item:
                raise PatchError(f"{'.'.join(path)}: $patch: delete element lacks merge key {key!r}")
            result = [i for i in result if not (isinstance(i, Mapping) and i.get(key) == item[key])]
        elif directive is not None:
            raise PatchError(f"unknown $patch directive {directive!r} in {'.'.join(path)}")
        else:
            plain.append(item)
    for item in plain:
        if key not in item:
            raise PatchError(f"{'.'.join(path)} merges by {key!r}; element {dict(item)!r} lacks it")
        for index, existing in enumerate(result):
            if isinstance(existing, Mapping) and existing.get(key) == item[key]:
                merged = _smp_map(dict(existing), item, path, table)
                result[index] = merged if merged is not None else existing
                break
        else:
            result.append(_smp_map({}, item, path, table) or {})
    return result


def json_patch(target: Mapping[str, Any], patch: Any) -> dict[str, Any]:
    if not isinstance(patch, list):
        raise PatchError(f"a JSON patch must be a list of operations, got {type(patch).__name__}")
    try:
        result = jsonpatch.JsonPatch(patch).apply(copy.deepcopy(dict(target)))
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, TypeError) as exc:
        raise PatchError(f"JSON patch failed: {exc}") from exc
    if not isinstance(result, dict):
        raise PatchError("JSON patch replaced the whole object with a non-object")
    return result


MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


def apply(
    content_type: str, target: Mapping[str, Any], patch: Any, *, kind: str, custom: bool
) -> dict[str, Any]:
    """Apply a patch of the given media type, raising the API server's error for unknown ones."""
    media = content_type.split(";", 1)[0].strip().lower()
    allowed = [JSON, MERGE] if custom else [JSON, MERGE, STRATEGIC]
    if media not in allowed:
        # Custom resources have no Go struct tags to strategic-merge by; kube-apiserver answers 415 too.
        raise errors.unsupported_media_type(media, allowed)
    try:
        if media == MERGE:
            result = merge_patch(target, patch)
            if not isinstance(result, dict):
                raise PatchError("a merge patch must be a JSON object")
            return result
        if media == STRATEGIC:
            return strategic_merge_patch(target, patch, kind=kind)
        return json_patch(target, patch)
    except PatchError as exc:
        raise errors.ApiError(
            code=422 if media == JSON else 400,
            reason="Invalid" if media == JSON else "BadRequest",
            message=str(exc),
        ) from exc
