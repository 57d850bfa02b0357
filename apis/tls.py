"""TLS for fgpu's network listeners and their clients: which files, the credentials built from them,
and what counts as loopback.

The rule every component follows: a listener is a unix socket or bound to
loopback, unless it speaks *mutual* TLS. Whoever can reach a listener of the
scheduler can ask it to reserve and bind, so beyond loopback the server proves
itself with its certificate and accepts only clients whose certificate the
configured CA signed (`require_client_auth=True`). A loopback listener is
reachable only from the same network namespace (the containers of one pod;
under `hostNetwork` the whole node, so use a unix socket there).

One `TLSFiles` value serves both ends: a server's `ca_file` is the CA its
clients' certificates must chain to; a client's `ca_file` is the CA the
server's certificate must chain to. The files are read when a listener or a
channel is built, so a mistake surfaces at start, naming the setting and the
path.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass

import grpc

from apis import grpc_server, hostport


class TLSError(ValueError):
    """TLS settings that cannot be used; the message names the setting, the value and the fix."""


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for one end of a mutual-TLS connection; all empty means "no TLS"."""

    cert_file: str = ""
    key_file: str = ""
    #: server: the CA that signs the clients' certificates; client: the CA that signs the server's
    ca_file: str = ""
    #: client only: the name to expect in the server's certificate, when it differs from the dialled host
    server_name: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.key_file or self.ca_file)

    def missing(self) -> tuple[str, ...]:
        """Which of cert_file, key_file, ca_file are empty (mutual TLS needs all three)."""
        return tuple(
            name for name, value in (("cert_file", self.cert_file), ("key_file", self.key_file), ("ca_file", self.ca_file))
            if not value
        )


def check_complete(files: TLSFiles, *, field: str, keys: tuple[str, str, str]) -> None:
    """Refuses TLS settings given in part; `keys` are the config's names for cert, key and CA."""
    if not files.enabled:
        return
    names = dict(zip(("cert_file", "key_file", "ca_file"), keys, strict=True))
    missing = [names[m] for m in files.missing()]
    if missing:
        raise TLSError(
            f"{field}: {', '.join(missing)} missing; mutual TLS needs {', '.join(keys)} "
            "(the server's certificate and key, and the CA that signs the other end's certificates)"
        )


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and loopback IP literals (127.0.0.0/8, ::1); an empty host means every interface."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to anything


def split_hostport(address: str, *, field: str, example: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` or `[V6]:PORT`; the host may be empty."""
    _host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise TLSError(f"{field}={address!r}: expected HOST:PORT, e.g. {example}")
    return hostport.split(address)


def check_listener(address: str, files: TLSFiles, *, field: str, tls_key: str) -> None:
    """Refuses a TCP listener beyond loopback that has no mutual TLS.

    `address` is a gRPC address (`unix:///path` or `HOST:PORT`) or an HTTP `HOST:PORT`;
    `tls_key` is the setting that would supply TLS, for the message.
    """
    where = _beyond_loopback(address, files, field=field)
    if where:
        raise TLSError(
            f"{field}={address!r}: listens on {where} without TLS, and anyone who reaches it could "
            f"reserve and bind; listen on 127.0.0.1 or a unix:// socket, or give {tls_key} "
            "(certificate, key and client CA: clients must present a certificate)"
        )


def check_dial(address: str, files: TLSFiles, *, field: str, tls_key: str) -> None:
    """Refuses plaintext to a TCP address beyond loopback: fgpu listens there only with mutual TLS."""
    where = _beyond_loopback(address, files, field=field)
    if where:
        raise TLSError(
            f"{field}={address!r}: {where} is beyond loopback, where fgpu listens only with mutual TLS; "
            f"give {tls_key} (the server's CA, and this client's certificate and key), or use a unix:// socket"
        )


def _beyond_loopback(address: str, files: TLSFiles, *, field: str) -> str:
    """How a plaintext TCP address beyond loopback reads ("host 'x'"); "" when it is fine."""
    if not address:
        return ""
    try:
        parsed = grpc_server.parse_address(address, field=field)
    except grpc_server.AddressError as exc:
        raise TLSError(str(exc)) from None
    if parsed.unix_path is not None or files.enabled:
        return ""
    host, _port = split_hostport(address, field=field, example="127.0.0.1:9444")
    if is_loopback_host(host):
        return ""
    return f"host {host!r}" if host else "every interface (no host)"


def _read(path: str, *, field: str, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise TLSError(f"{field}: cannot read {what} {path!r} ({exc.strerror}); give an existing PEM file") from None


def grpc_server_credentials(files: TLSFiles, *, field: str) -> grpc.ServerCredentials:
    """Server credentials that require a client certificate signed by `files.ca_file`."""
    key = _read(files.key_file, field=field, what="the private key")
    cert = _read(files.cert_file, field=field, what="the certificate")
    ca = _read(files.ca_file, field=field, what="the client CA")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def grpc_channel(address: str, files: TLSFiles, *, field: str) -> grpc.Channel:
    """A channel to `address`: mutual TLS with `files` when enabled, else plaintext."""
    target = grpc_server.parse_address(address, field=field).grpc_target
    options: list[tuple[str, int | str]] = list(grpc_server.CHANNEL_OPTIONS)
    if not files.enabled:
        return grpc.insecure_channel(target, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(files.ca_file, field=field, what="the server CA"),
        private_key=_read(files.key_file, field=field, what="the private key"),
        certificate_chain=_read(files.cert_file, field=field, what="the certificate"),
    )
    if files.server_name:
        options.append(("grpc.ssl_target_name_override", files.server_name))
    return grpc.secure_channel(target, credentials, options=options)


def add_secure_listener(server: grpc.Server, address: str, files: TLSFiles, *, field: str) -> int:
    """Binds `server` to `address` with mutual TLS; returns the port (0 for a unix socket)."""
    parsed = grpc_server.parse_address(address, field=field)
    if parsed.unix_path is not None:
        grpc_server.prepare_unix_socket(parsed.unix_path)
    port = server.add_secure_port(parsed.grpc_target, grpc_server_credentials(files, field=field))
    if parsed.unix_path is None and port == 0:
        raise TLSError(f"{field}={address!r}: could not bind; is the port in use?")
    if parsed.unix_path is not None:
        grpc_server.finish_unix_socket(parsed.unix_path)
    return int(port)


def server_ssl_context(files: TLSFiles, *, field: str) -> ssl.SSLContext:
    """An HTTPS server context that requires a client certificate signed by `files.ca_file`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSError(
            f"{field}: cannot load certificate {files.cert_file!r} with key {files.key_file!r} ({exc}); "
            "give a PEM certificate and its private key"
        ) from None
    try:
        context.load_verify_locations(cafile=files.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSError(f"{field}: cannot load the client CA {files.ca_file!r} ({exc}); give a PEM CA certificate") from None
    return context
