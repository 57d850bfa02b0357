"""Whether a backend can enforce a share on this node: the verdict as data, and what a check may read.

Pure: a backend's `check` reads files only through the `Files` protocol (the real one is
`agent.backendcheck.HostFiles`), so every verdict is tested table-driven on fake bytes.
`elf_problem` reads an ELF header, for backends that ship a library (HAMi-core's
libvgpu.so is read, never loaded: dlopen would run its constructors in the agent).
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from typing import Literal, Protocol

#: ELF e_machine values for the architectures GPU nodes run (elf.h).
ELF_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21, "ppc64": 21, "s390x": 22}
_ET_DYN = 3


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
    #: the backend's registered name
    isolation: str
    ready: bool
    #: CamelCase, as a condition's reason: Ready, NoLimits, LibraryMissing, NotSharedObject,
    #: WrongArchitecture, PreloadMissing, PreloadMismatch, MPSDaemonNotRunning
    reason: str
    message: str

    @property
    def problem(self) -> str:
        """Empty when ready; otherwise what the hook says when it rejects a share."""
        return "" if self.ready else self.message


class Files(Protocol):
    def head(self, path: str, size: int) -> bytes:
        """The first `size` bytes of a regular file (following links); raises OSError otherwise."""
        ...

    def is_socket_or_fifo(self, path: str) -> bool: ...


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
