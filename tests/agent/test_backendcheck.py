"""Is the isolation backend usable? HAMi-core's library read (never loaded) as an ELF shared object for this
machine, its preload file, the MPS control daemon's pipe; table-driven over fake files, then the real ones."""

from __future__ import annotations

import os
import socket
import struct
import sys
import sysconfig
from pathlib import Path

import pytest

from agent.backendcheck import HostFiles, check
from agent.isolation.readiness import BackendStatus, Machine, elf_problem
from agent.isolation.registry import IsolationPaths
from apis import names

X86 = Machine(name="x86_64", bits=64, little_endian=True)
ARM = Machine(name="aarch64", bits=64, little_endian=True)
PATHS = IsolationPaths()


def elf(*, bits: int = 64, little: bool = True, e_type: int = 3, machine: int = 62) -> bytes:
    """An ELF header with the fields the check reads (the rest zero), 64 bytes."""
    order = "<" if little else ">"
    ident = b"\x7fELF" + bytes([1 if bits == 32 else 2, 1 if little else 2, 1]) + b"\0" * 9
    return (ident + struct.pack(f"{order}HH", e_type, machine)).ljust(64, b"\0")


class FakeFiles:
    def __init__(self, files: dict[str, bytes] | None = None, *, sockets: tuple[str, ...] = ()) -> None:
        self.files = files or {}
        self.sockets = set(sockets)
        self.read: list[str] = []

    def head(self, path: str, size: int) -> bytes:
        self.read.append(path)
        if path not in self.files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return self.files[path][:size]

    def is_socket_or_fifo(self, path: str) -> bool:
        return path in self.sockets


PRELOAD_OK = b"/usr/local/vgpu/libvgpu.so\n"


@pytest.mark.parametrize(
    ("header", "machine", "reason", "says"),
    [
        (elf(), X86, "", ""),
        (elf(machine=183), ARM, "", ""),
        (b"#!/bin/sh\necho not a library\n", X86, "NotSharedObject", "not an ELF file"),
        (b"\x7fEL", X86, "NotSharedObject", "not an ELF file"),
        (elf(e_type=2), X86, "NotSharedObject", "an executable, not a shared object"),
        (elf(e_type=1), X86, "NotSharedObject", "a relocatable object"),
        (elf(bits=32), X86, "WrongArchitecture", "32-bit little-endian ELF, this node needs 64-bit"),
        (elf(little=False), X86, "WrongArchitecture", "big-endian"),
        (elf(machine=183), X86, "WrongArchitecture", "built for aarch64, this node is x86_64"),
        (elf(machine=62), ARM, "WrongArchitecture", "built for x86_64, this node is aarch64"),
    ],
    ids=["x86-so", "arm-so", "script", "truncated", "executable", "object", "32-bit", "big-endian", "arm-on-x86", "x86-on-arm"],
)
def test_only_a_shared_object_for_this_machine_passes(header: bytes, machine: Machine, reason: str, says: str) -> None:
    got_reason, message = elf_problem(header, machine=machine)
    assert got_reason == reason
    assert says in message


def _hami(files: FakeFiles, machine: Machine = X86) -> BackendStatus:
    return check(names.ISOLATION_HAMI_CORE, PATHS, files=files, machine=machine)


def test_hami_core_is_ready_with_the_library_and_a_preload_file_naming_it_in_the_container() -> None:
    status = _hami(FakeFiles({PATHS.hami_library: elf(), PATHS.hami_preload: PRELOAD_OK}))
    assert (status.ready, status.reason, status.problem) == (True, "Ready", "")


@pytest.mark.parametrize(
    ("files", "reason", "says"),
    [
        ({}, "LibraryMissing", "/usr/local/vgpu/libvgpu.so cannot be read (No such file or directory)"),
        ({PATHS.hami_library: b"", PATHS.hami_preload: PRELOAD_OK}, "NotSharedObject", "not an ELF file"),
        ({PATHS.hami_library: elf(machine=183), PATHS.hami_preload: PRELOAD_OK}, "WrongArchitecture", "aarch64"),
        ({PATHS.hami_library: elf()}, "PreloadMissing", "preload file /usr/local/vgpu/ld.so.preload cannot be read"),
        ({PATHS.hami_library: elf(), PATHS.hami_preload: b""}, "PreloadMismatch", "names nothing"),
        ({PATHS.hami_library: elf(), PATHS.hami_preload: b"/opt/other.so\n"}, "PreloadMismatch", "names /opt/other.so"),
    ],
    ids=["missing", "empty-file", "wrong-arch", "no-preload", "empty-preload", "other-preload"],
)
def test_hami_core_is_not_ready_and_says_why_and_how_to_fix_it(files: dict[str, bytes], reason: str, says: str) -> None:
    status = _hami(FakeFiles(files))
    assert (status.ready, status.reason) == (False, reason)
    assert says in status.message and status.problem == status.message
    assert "install-hami-core init container" in status.message


def test_mps_is_ready_only_while_the_control_daemon_has_its_pipe() -> None:
    control = os.path.join(PATHS.mps_pipe_dir, "control")
    ready = check(names.ISOLATION_MPS, PATHS, files=FakeFiles(sockets=(control,)), machine=X86)
    assert (ready.ready, ready.reason) == (True, "Ready")
    down = check(names.ISOLATION_MPS, PATHS, files=FakeFiles(), machine=X86)
    assert (down.ready, down.reason) == (False, "MPSDaemonNotRunning")
    assert f"CUDA_MPS_PIPE_DIRECTORY={PATHS.mps_pipe_dir}" in down.message


def test_none_needs_nothing_and_reads_nothing() -> None:
    files = FakeFiles()
    status = check(names.ISOLATION_NONE, PATHS, files=files, machine=X86)
    assert (status.ready, status.reason) == (True, "NoLimits")
    assert files.read == []


def test_the_library_is_read_never_loaded(tmp_path: Path) -> None:
    """A library whose loading would run code: the check reads its header and nothing runs."""
    library = tmp_path / "libvgpu.so"
    library.write_bytes(elf(machine=_this_machine_code()) + b"constructor would run here")
    before = set(Path("/proc/self/maps").read_text().split())
    status = check(names.ISOLATION_HAMI_CORE, _paths(tmp_path, library), files=HostFiles(), machine=Machine.this())
    assert status.ready, status.message
    assert str(library) not in Path("/proc/self/maps").read_text()
    assert str(library) not in before


def test_a_real_shared_object_of_this_machine_passes_and_this_python_executable_does_not(tmp_path: Path) -> None:
    real = Path(sysconfig.get_config_var("LIBDIR") or "/usr/lib") / str(sysconfig.get_config_var("LDLIBRARY") or "")
    if not real.is_file() or (not real.name.endswith(".so") and ".so." not in real.name):
        import _ctypes

        real = Path(_ctypes.__file__)  # an extension module: a shared object of this machine too
    status = check(names.ISOLATION_HAMI_CORE, _paths(tmp_path, real), files=HostFiles(), machine=Machine.this())
    assert status.ready, status.message
    executable = check(names.ISOLATION_HAMI_CORE, _paths(tmp_path, Path(sys.executable).resolve()), files=HostFiles(),
                       machine=Machine.this())
    # An executable may be position-independent (also ET_DYN); a directory never passes.
    assert executable.reason in ("Ready", "NotSharedObject")
    directory = check(names.ISOLATION_HAMI_CORE, _paths(tmp_path, tmp_path), files=HostFiles(), machine=Machine.this())
    assert (directory.ready, directory.reason) == (False, "LibraryMissing")


def test_a_real_control_socket_or_fifo_counts_as_a_running_mps_daemon(tmp_path: Path) -> None:
    paths = IsolationPaths(mps_pipe_dir=str(tmp_path))
    assert not check(names.ISOLATION_MPS, paths, files=HostFiles(), machine=Machine.this()).ready
    os.mkfifo(tmp_path / "control")
    assert check(names.ISOLATION_MPS, paths, files=HostFiles(), machine=Machine.this()).ready
    os.unlink(tmp_path / "control")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "control"))
        assert check(names.ISOLATION_MPS, paths, files=HostFiles(), machine=Machine.this()).ready
    (tmp_path / "control").unlink()
    (tmp_path / "control").write_text("a plain file is no daemon")
    assert not check(names.ISOLATION_MPS, paths, files=HostFiles(), machine=Machine.this()).ready


def _paths(tmp: Path, library: Path) -> IsolationPaths:
    preload = tmp / "ld.so.preload"
    preload.write_bytes(PRELOAD_OK)
    return IsolationPaths(hami_library=str(library), hami_preload=str(preload))


def _this_machine_code() -> int:
    from agent.isolation.readiness import ELF_MACHINES

    return ELF_MACHINES[Machine.this().name]
