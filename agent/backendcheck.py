"""Can this node's isolation backend enforce a GPU share? The check, and the verdict as data.

- `hami-core`: HAMi-core's library must be at `isolationPaths.hamiLibrary` and be a shared object
  (ELF, type ET_DYN) for this machine's architecture, word size and byte order; the preload file
  at `isolationPaths.hamiPreload` must name it where the hook mounts it in containers
  (`hamiContainerDir`/libvgpu.so). The library is only read, never loaded: dlopen would run its
  constructors and hook CUDA and NVML in the agent itself.
- `mps`: the MPS control daemon's pipe directory (`isolationPaths.mpsPipeDir`) must hold its
  `control` socket (or pipe), which exists while the daemon runs.
- `none`: always ready; it enforces nothing by design.

Pure over what the files hold: the `Files` protocol reads them (the real one is `HostFiles`), so
the verdicts are tested table-driven on fake bytes. A node that is not ready says so in its
FgpuIsolationReady condition (`agent.backendreport`) and the hook refuses limited shares there
(`agent.hook`); whole GPUs and MIG instances need no software limit and still work.
"""

from __future__ import annotations

import os
import platform
import stat
import sys
from dataclasses import dataclass
from typing import Literal, Protocol

from agent.isolation import Isolation, IsolationPaths
from apis import names

#: The Node condition type the agent writes (status True when the backend can enforce shares).
CONDITION_TYPE = names.ISOLATION_READY_CONDITION

#: ELF e_machine values for the architectures GPU nodes run (elf.h).
ELF_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21, "ppc64": 21, "s390x": 22}
_ET_DYN = 3
_HEADER = 64


@dataclass(frozen=True)
class Machine:
    """What a loadable library must be built for."""

    name: str  # platform.machine()
    bits: int  # 32 or 64
    little_endian: bool

    @classmethod
    def this(cls) -> Machine:
        return cls(name=platform.machine(), bits=64 if sys.maxsize > 2**32 else 32, little_endian=sys.byteorder == "little")


@dataclass(frozen=True)
class BackendStatus:
    isolation: Isolation
    ready: bool
    #: CamelCase, as a condition's reason: Ready, NoLimits, LibraryMissing, NotSharedObject,
    #: WrongArchitecture, PreloadMissing, PreloadMismatch, MPSDaemonNotRunning
    reason: str
    message: str

    @property
    def problem(self) -> str:
        """Empty when ready; otherwise what the hook says when it refuses a share."""
        return "" if self.ready else self.message


class Files(Protocol):
    def head(self, path: str, size: int) -> bytes:
        """The first `size` bytes of a regular file (following links); raises OSError otherwise."""
        ...

    def is_socket_or_fifo(self, path: str) -> bool: ...


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


def check(isolation: Isolation, paths: IsolationPaths, *, files: Files, machine: Machine) -> BackendStatus:
    if isolation is Isolation.HAMI_CORE:
        return _hami_core(paths, files, machine)
    if isolation is Isolation.MPS:
        control = os.path.join(paths.mps_pipe_dir, "control")
        if files.is_socket_or_fifo(control):
            return BackendStatus(isolation, True, "Ready", f"mps: the MPS control daemon answers at {control}")
        return BackendStatus(
            isolation, False, "MPSDaemonNotRunning",
            f"isolation mps: no MPS control daemon on this node ({control} is not there); start "
            f"nvidia-cuda-mps-control -d with CUDA_MPS_PIPE_DIRECTORY={paths.mps_pipe_dir}",
        )
    return BackendStatus(isolation, True, "NoLimits", "isolation none: GPU shares run without limits (visibility only)")


def elf_problem(header: bytes, *, machine: Machine) -> tuple[str, str]:
    """("", "") when `header` starts a shared object loadable on `machine`; else (reason, what is wrong)."""
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return "NotSharedObject", "it is not an ELF file"
    bits = {1: 32, 2: 64}.get(header[4], 0)
    little = {1: True, 2: False}.get(header[5])
    if bits != machine.bits or little is not machine.little_endian:
        order = "little" if little else "big"
        want = "little" if machine.little_endian else "big"
        return "WrongArchitecture", f"it is a {bits or '?'}-bit {order}-endian ELF, this node needs {machine.bits}-bit {want}-endian"
    byteorder: Literal["little", "big"] = "little" if little else "big"
    e_type = int.from_bytes(header[16:18], byteorder)
    if e_type != _ET_DYN:
        kind = {1: "a relocatable object", 2: "an executable", 4: "a core dump"}.get(e_type, f"ELF type {e_type}")
        return "NotSharedObject", f"it is {kind}, not a shared object"
    wanted = ELF_MACHINES.get(machine.name)
    e_machine = int.from_bytes(header[18:20], byteorder)
    if wanted is not None and e_machine != wanted:
        built = next((name for name, code in ELF_MACHINES.items() if code == e_machine), f"machine {e_machine}")
        return "WrongArchitecture", f"it is built for {built}, this node is {machine.name}"
    return "", ""


def _hami_core(paths: IsolationPaths, files: Files, machine: Machine) -> BackendStatus:
    library = paths.hami_library
    fix = "the agent DaemonSet's install-hami-core init container puts it there (docs/deploy.md)"
    try:
        header = files.head(library, _HEADER)
    except OSError as err:
        return BackendStatus(
            Isolation.HAMI_CORE, False, "LibraryMissing",
            f"isolation hami-core: HAMi-core's library {library} cannot be read ({err.strerror or err}); {fix}",
        )
    reason, wrong = elf_problem(header, machine=machine)
    if reason:
        return BackendStatus(
            Isolation.HAMI_CORE, False, reason, f"isolation hami-core: {library} cannot be loaded: {wrong}; {fix}"
        )
    expected = os.path.join(paths.hami_container_dir, "libvgpu.so")
    try:
        preload = files.head(paths.hami_preload, 4096).decode("utf-8", "replace")
    except OSError as err:
        return BackendStatus(
            Isolation.HAMI_CORE, False, "PreloadMissing",
            f"isolation hami-core: the preload file {paths.hami_preload} cannot be read ({err.strerror or err}); "
            f"it must name {expected}; {fix}",
        )
    named = [line.strip() for line in preload.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if expected not in named:
        return BackendStatus(
            Isolation.HAMI_CORE, False, "PreloadMismatch",
            f"isolation hami-core: the preload file {paths.hami_preload} names {', '.join(named) or 'nothing'}, "
            f"not {expected}, so containers would run without HAMi-core's limits; {fix}",
        )
    return BackendStatus(Isolation.HAMI_CORE, True, "Ready", f"hami-core: {library} is a shared object for {machine.name}")
