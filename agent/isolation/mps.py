"""`mps`: the NVIDIA MPS server enforces per-client memory and compute limits.

Clients that reach the control daemon's pipe directory get `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
(per CUDA ordinal) and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` (one for all of a client's
devices). The node runs `nvidia-cuda-mps-control -d`; the check looks for its control socket.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from agent.isolation.edits import BackendEdits, VisibleGPU
from agent.isolation.readiness import BackendStatus, Files, Machine
from agent.isolation.registry import IsolationPaths, PathKey, register_backend
from apis import names
from apis.container_edits import ContainerEdits, Mount

_MIB = 2**20

PIPE_DIR = PathKey("mpsPipeDir", "/run/nvidia/mps", "pipe directory of the node's MPS control daemon (mounted at the same path)")


def edits(gpus: Sequence[VisibleGPU], *, paths: IsolationPaths, pod_uid: str, container_name: str) -> BackendEdits:
    pipe_dir = paths[PIPE_DIR]
    # One thread percentage for all of a client's devices: the smallest share is the safe one. A
    # memory-only share (core 0) gets no compute cap: MPS has no "0 = unlimited".
    threads = min(100 if g.unlimited else g.core_percent for g in gpus)
    return BackendEdits(ContainerEdits(
        envs=(
            (names.MPS_PIPE_DIRECTORY, pipe_dir),
            # A burstable share pins up to its limit; its thread percentage stays its request's, as
            # MPS cannot lower a running client's (docs/overcommit.md).
            (names.MPS_PINNED_MEM_LIMIT, ",".join(
                f"{i}={(g.burst_memory_bytes if g.burstable else g.memory_bytes) // _MIB}M" for i, g in enumerate(gpus)
            )),
            (names.MPS_ACTIVE_THREAD_PERCENTAGE, str(threads if threads > 0 else 100)),
        ),
        mounts=(Mount(container_path=pipe_dir, host_path=pipe_dir, readonly=False),),
    ))


def check(paths: IsolationPaths, *, files: Files, machine: Machine) -> BackendStatus:
    """The control daemon's `control` socket (or pipe) exists while it runs."""
    control = os.path.join(paths[PIPE_DIR], "control")
    if files.is_socket_or_fifo(control):
        return BackendStatus(names.ISOLATION_MPS, True, "Ready", f"mps: the MPS control daemon answers at {control}")
    return BackendStatus(
        names.ISOLATION_MPS, False, "MPSDaemonNotRunning",
        f"isolation mps: no MPS control daemon on this node ({control} is not there); start "
        f"nvidia-cuda-mps-control -d with CUDA_MPS_PIPE_DIRECTORY={paths[PIPE_DIR]}",
    )


register_backend(
    names.ISOLATION_MPS,
    summary="NVIDIA MPS limits memory and compute (needs the MPS control daemon)",
    edits=edits,
    check=check,
    path_keys=(PIPE_DIR,),
    env_prefixes=(names.MPS_ENV_PREFIX,),
)
