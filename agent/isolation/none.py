"""`none`: visibility only. The container sees its GPUs and nothing limits it.

For trusted teams and whole GPUs; also what a container gets when none of its GPUs needs a
software limit (whole GPUs, MIG instances), whatever the node's backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.isolation.edits import BackendEdits, VisibleGPU
from agent.isolation.readiness import BackendStatus, Files, Machine
from agent.isolation.registry import IsolationPaths, register_backend
from apis import names


def edits(gpus: Sequence[VisibleGPU], *, paths: IsolationPaths, pod_uid: str, container_name: str) -> BackendEdits:
    return BackendEdits()


def check(paths: IsolationPaths, *, files: Files, machine: Machine) -> BackendStatus:
    return BackendStatus(names.ISOLATION_NONE, True, "NoLimits", "isolation none: GPU shares run without limits (visibility only)")


register_backend(
    names.ISOLATION_NONE,
    summary="visibility only, for trusted teams or whole GPUs",
    edits=edits,
    check=check,
    enforces_limits=False,
)
