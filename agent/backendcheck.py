"""Can this node's isolation backend enforce a GPU share? The dispatch, and the real file system.

Each backend says what it needs in its own `check` (`agent/isolation/<backend>.py`): HAMi-core
a readable shared object and a preload file naming it, MPS its control daemon's pipe, `none`
nothing. The checks read files only through `readiness.Files`; `HostFiles` is the real one. A
node that is not ready says so in its FgpuIsolationReady condition (`agent.backendreport`)
and the hook rejects limited shares there (`agent.hook`); whole GPUs and MIG instances need
no software limit and still work.
"""

from __future__ import annotations

import os
import stat

from agent.isolation import registry
from agent.isolation.readiness import BackendStatus, Files, Machine
from agent.isolation.registry import IsolationPaths
from apis import names

#: The Node condition type the agent writes (status True when the backend can enforce shares).
CONDITION_TYPE = names.ISOLATION_READY_CONDITION


class HostFiles:
    """The real file system (the DaemonSet mounts the backend's host paths at the same paths)."""

    def head(self, path: str, size: int) -> bytes:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IsADirectoryError(f"{path} is not a regular file")
            return os.read(fd, size)
        finally:
            os.close(fd)

    def is_socket_or_fifo(self, path: str) -> bool:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return False
        return stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode)


def check(isolation: str, paths: IsolationPaths, *, files: Files, machine: Machine) -> BackendStatus:
    """The verdict of the backend named `isolation` (a registered name)."""
    return registry.backend(isolation).check(paths, files=files, machine=machine)
