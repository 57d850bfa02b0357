"""The backend walkthrough (docs/architecture.md, "How to add an isolation backend"): a `none`-like
backend in one module, registered only while the tests that import it run.

`visible-only` limits nothing, like `none`, but hands each GPU to the container as a CDI device
and a device node, caps the container's pids through cgroup v2, and keeps a state directory per
pod that `on_pod_stopped` removes: one of each kind of edit, so the tests see the hook server
carry every kind. In the tree it would be `agent/isolation/visible_only.py` and be discovered.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection, Sequence

from agent.isolation.edits import BackendEdits, VisibleGPU
from agent.isolation.readiness import BackendStatus, Files, Machine
from agent.isolation.registry import IsolationPaths, PathKey, register_backend
from apis.container_edits import CgroupResources, ContainerEdits, DeviceNode

NAME = "visible-only"
STATE_ROOT = PathKey("visibleOnlyStateRoot", "/var/lib/fgpu/visible-only", "one directory per pod admitted under it")


def edits(gpus: Sequence[VisibleGPU], *, paths: IsolationPaths, pod_uid: str, container_name: str) -> BackendEdits:
    state = os.path.join(paths[STATE_ROOT], pod_uid)
    return BackendEdits(
        ContainerEdits(
            cdi_devices=tuple(f"nvidia.com/gpu={g.uuid}" for g in gpus),
            devices=(DeviceNode(container_path="/dev/nvidia-uvm", host_path="/dev/nvidia-uvm"),),
            resources=CgroupResources(unified={"pids.max": "4096"}),
        ),
        host_dirs=(state,),
    )


def check(paths: IsolationPaths, *, files: Files, machine: Machine) -> BackendStatus:
    return BackendStatus(NAME, True, "NoLimits", f"isolation {NAME}: GPU shares run without limits")


def on_pod_stopped(paths: IsolationPaths, *, pod_uid: str) -> None:
    if pod_uid and "/" not in pod_uid and not pod_uid.startswith("."):
        shutil.rmtree(os.path.join(paths[STATE_ROOT], pod_uid), ignore_errors=True)


def remove_leftovers(paths: IsolationPaths, *, live_uids: Collection[str], min_age_s: float) -> list[str]:
    root = paths[STATE_ROOT]
    gone = sorted(set(os.listdir(root)) - set(live_uids)) if os.path.isdir(root) else []
    for uid in gone:
        shutil.rmtree(os.path.join(root, uid), ignore_errors=True)
    return gone


register_backend(
    NAME,
    summary="visibility only, through CDI (a test's walkthrough backend)",
    edits=edits,
    check=check,
    on_pod_stopped=on_pod_stopped,
    remove_leftovers=remove_leftovers,
    path_keys=(STATE_ROOT,),
    enforces_limits=False,
)
