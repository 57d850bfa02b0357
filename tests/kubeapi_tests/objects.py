"""Small object builders shared by the double's tests."""

from __future__ import annotations

from typing import Any

from apis import names

DEVICE_API = (names.DEVICE_GROUP, names.DEVICE_VERSION, names.DEVICE_PLURAL)


def pod(name: str, *, labels: dict[str, str] | None = None, node: str = "", **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}, **meta}, "spec": spec}


def node(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}}


def device(name: str, *, minors: int = 1) -> dict[str, Any]:
    gpus = [{"type": "gpu", "id": f"GPU-{i}", "minor": i, "health": True} for i in range(minors)]
    return {
        "apiVersion": f"{names.DEVICE_GROUP}/{names.DEVICE_VERSION}",
        "kind": names.DEVICE_KIND,
        "metadata": {"name": name},
        "spec": {"devices": gpus},
    }
