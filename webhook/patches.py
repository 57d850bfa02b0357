"""JSONPatch (RFC 6902) operations over a Pod, with JSON Pointers (RFC 6901) escaped.

A pointer token escapes "~" as "~0" and "/" as "~1", in that order, so the
annotation key `fgpu.io/allocation-node` is the path
`/metadata/annotations/fgpu.io~1allocation-node`.

Example patch (what the mutating webhook sends, before base64)::

    [{"op": "replace", "path": "/spec/schedulerName", "value": "fgpu-scheduler"},
     {"op": "remove", "path": "/metadata/annotations/fgpu.io~1allocation-node"}]
"""

from __future__ import annotations

from typing import Any

#: One operation: {"op": ..., "path": ..., ["value": ...]}.
Operation = dict[str, Any]


def escape(token: str) -> str:
    """One reference token of a JSON Pointer."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str) -> str:
    """The JSON Pointer of a path of object keys: pointer("metadata", "annotations", key)."""
    return "".join("/" + escape(t) for t in tokens)


def add(path: str, value: object) -> Operation:
    return {"op": "add", "path": path, "value": value}


def replace(path: str, value: object) -> Operation:
    return {"op": "replace", "path": path, "value": value}


def remove(path: str) -> Operation:
    return {"op": "remove", "path": path}
