"""Builders for Pod dicts as the Kubernetes API returns them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def container(
    name: str = "main",
    *,
    limits: Mapping[str, object] | None = None,
    requests: Mapping[str, object] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    out: dict[str, Any] = {"name": name, "image": "busybox:1.36", "resources": resources}
    if restart_policy is not None:
        out["restartPolicy"] = restart_policy
    return out


def pod(
    *containers: dict[str, Any],
    init: Sequence[dict[str, Any]] = (),
    name: str = "p",
    namespace: str = "ml",
    overhead: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if overhead is not None:
        spec["overhead"] = dict(overhead)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def limits_pod(limits: Mapping[str, object]) -> dict[str, Any]:
    """A one-container pod asking with limits only (requests default to them)."""
    return pod(container(limits=limits))
