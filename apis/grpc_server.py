"""What every fgpu gRPC server has in common: addresses, health, reflection.

Every server in the project serves the standard `grpc.health.v1.Health`
service and server reflection, so an operator can always run
`grpcurl -plaintext -unix SOCKET list` (and `describe`) against it.
Reflection lists only what the server serves; health may also report on
services served elsewhere (`reported`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import cast

import grpc
from google.protobuf import descriptor, descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

UNIX_PREFIX = "unix://"

#: kubelet's own limit; servers and channels in fgpu accept at least this much.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)


class AddressError(ValueError):
    """A listen or dial address fgpu cannot use."""


@dataclass(frozen=True)
class Address:
    """A parsed address: a unix socket path, or a host:port."""

    unix_path: str | None
    hostport: str | None

    @property
    def grpc_target(self) -> str:
        """The form grpcio's `add_insecure_port` and `insecure_channel` take."""
        if self.unix_path is not None:
            return f"unix:{self.unix_path}" if not self.unix_path.startswith("/") else f"unix://{self.unix_path}"
        assert self.hostport is not None
        return self.hostport


def parse_address(value: str, *, field: str = "address") -> Address:
    """Parses `unix:///abs/path`, `unix:rel/path` or `host:port`."""
    if value.startswith(UNIX_PREFIX):
        path = value[len(UNIX_PREFIX):]
        if not path.startswith("/"):
            raise AddressError(
                f"{field}={value!r}: a unix:// address needs an absolute path; write unix:///run/fgpu/x.sock"
            )
        return Address(unix_path=path, hostport=None)
    if value.startswith("unix:"):
        return Address(unix_path=value[len("unix:"):], hostport=None)
    if value.startswith("/"):
        return Address(unix_path=value, hostport=None)
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise AddressError(
            f"{field}={value!r}: expected unix:///PATH or HOST:PORT, e.g. unix:///run/fgpu/agent.sock or 127.0.0.1:9443"
        )
    return Address(unix_path=None, hostport=value)


def prepare_unix_socket(path: str) -> None:
    """Makes `path` free for a new listener.

    A stale socket left by a crashed process is removed; anything else at the
    path (a regular file, a directory) is refused rather than deleted, because
    it is not ours to delete.
    """
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise AddressError(f"{path} exists and is not a socket; remove it or choose another listen path")
    # The stopping owner may remove it between the lstat and here (a restart's successor starts
    # while its predecessor drains); gone is what we wanted.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def socket_path_lock(path: str) -> Iterator[None]:
    """Holds an exclusive lock on the socket's directory while a path is checked and bound or removed.

    A predecessor that removes "its" socket on stop checks the inode first; without the lock a
    successor could unlink and bind in between and lose its fresh socket to that removal. An
    advisory flock on the directory needs no extra file next to the socket.
    """
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except PermissionError:
        fd = -1
    try:
        # A directory we may not read, or a filesystem without locks: bind as before, unlocked,
        # rather than not serve.
        if fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # closing releases the flock


def finish_unix_socket(path: str, *, mode: int = 0o660, group: int | None = None) -> None:
    """Sets the permissions of a socket just created by a listener."""
    os.chmod(path, mode)
    if group is not None:
        with contextlib.suppress(PermissionError):
            os.chown(path, -1, group)


def add_listener(
    server: grpc.Server, address: str, *, field: str = "listen", mode: int = 0o660, group: int | None = None
) -> Address:
    """Binds `server` to `address`, replacing a stale unix socket safely."""
    addr = parse_address(address, field=field)
    if addr.unix_path is not None:
        prepare_unix_socket(addr.unix_path)
    port = server.add_insecure_port(addr.grpc_target)
    if addr.unix_path is None and port == 0:
        raise AddressError(f"{field}={address!r}: could not bind; is the port in use?")
    if addr.unix_path is not None:
        finish_unix_socket(addr.unix_path, mode=mode, group=group)
    return addr


def add_health_and_reflection(
    server: grpc.Server, service_names: Iterable[str], *, reported: Iterable[str] = ()
) -> health.HealthServicer:
    """Registers health and reflection: `service_names` are served here, `reported` only watched.

    Every name in `service_names` is a service this server serves: health says SERVING for it and
    reflection lists it (its descriptors must be in the default pool, or `grpcurl describe` fails).
    A name in `reported` is a service served elsewhere whose state this server reports (the runtime
    proxy's admin socket speaks for containerd's CRI services): health answers for it, starting at
    NOT_SERVING until the caller learns better, and reflection leaves it out.
    """
    names = list(service_names)
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    for name in names:
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    for name in reported:
        if name in names:
            raise ValueError(f"{name!r} is both served and reported; a service is one or the other")
        servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
        # Duck-typed: the servicer only calls Find* methods on it.
        pool=cast(descriptor_pool.DescriptorPool, _MethodAwarePool(descriptor_pool.Default())),
    )
    return servicer


class _MethodAwarePool:
    """The default descriptor pool, plus lookup of "pkg.Service.Method" symbols.

    The upb-backed pool cannot find the file of a method, so without this
    `grpcurl describe pkg.Service.Method` fails (grpc/grpc#34743).
    """

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> object:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str) -> descriptor.FileDescriptor:
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service_name, _, method = symbol.rpartition(".")
            if service_name:
                try:
                    service = self._pool.FindServiceByName(service_name)
                except KeyError:
                    pass
                else:
                    if method in service.methods_by_name:
                        return service.file
            raise


def insecure_channel(address: str, *, field: str = "address") -> grpc.Channel:
    """A client channel to an fgpu address, with the project's message limits."""
    return grpc.insecure_channel(parse_address(address, field=field).grpc_target, options=list(CHANNEL_OPTIONS))
