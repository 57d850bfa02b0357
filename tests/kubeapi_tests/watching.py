"""Collect watch events with the client's own `kubernetes.watch.Watch`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import watch


def collect(
    func: Callable[..., Any], *args: Any, count: int, timeout_s: int = 5, **kwargs: Any
) -> list[tuple[str, Any]]:
    """(type, object name or bookmark rv) of up to `count` events; stops early once it has them."""
    seen: list[tuple[str, Any]] = []
    w = watch.Watch()
    for event in w.stream(func, *args, timeout_seconds=timeout_s, **kwargs):
        obj = event["object"]
        if event["type"] == "BOOKMARK":
            seen.append(("BOOKMARK", event["raw_object"]["metadata"]["resourceVersion"]))
        elif isinstance(obj, dict):
            seen.append((event["type"], obj["metadata"]["name"]))
        else:
            seen.append((event["type"], obj.metadata.name))
        if len(seen) >= count:
            w.stop()
    return seen
