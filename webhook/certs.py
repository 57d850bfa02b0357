"""The serving certificate, reloaded when its files change: rotation restarts nothing.

cert-manager (or the chart's certificate Job) rewrites the Secret; the kubelet
swaps the mounted files (a symlink flip, so certificate and key change
together). `ServingCertificate` holds one `ssl.SSLContext` per loaded pair and
hands the newest to every new TLS handshake: the server's context carries an
SNI callback (OpenSSL calls it for every ClientHello, with or without SNI)
that looks at the files at most every `min_interval_s` and points the
connection at the current context. Connections already open keep the
certificate they started with.

A change is a change of either file's content (mtime alone misses a rewrite
within the same second, or a copy that keeps the old time). A pair that does
not load (a key that does not match its certificate halfway through a
rotation, a truncated file) is not applied: the previous pair keeps serving,
the reason is logged once and kept in `last_error`, and the next look tries
again.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from webhook.errors import CertificateError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CertificateInfo:
    """What the log says about a loaded certificate."""

    subject: str
    dns_names: tuple[str, ...]
    not_after: datetime.datetime
    sha256: str


class ServingCertificate:
    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        contents = self._read()
        if contents is None:
            raise CertificateError(self._unreadable())
        try:
            self._current = self._context(contents[0])
        except CertificateError as exc:
            raise CertificateError(f"{exc}; give the serving certificate (PEM) and its private key") from None
        self._loaded = contents
        self._checked_at = clock()
        self.info = _info(contents[0])
        #: Why the files as they are now were not applied; None after a good load.
        self.last_error: str | None = None
        self.reloads = 0
        # The context servers are built with: its callback switches each handshake to the newest pair.
        self._base = self._current
        self._base.sni_callback = self._on_hello
        log.info("serving certificate %s", _describe(self.info))

    def server_context(self) -> ssl.SSLContext:
        """The context to listen with; new handshakes get the newest certificate."""
        return self._base

    def current(self) -> ssl.SSLContext:
        """The context of the newest loaded pair (after a look at the files, if one is due)."""
        with self._lock:
            now = self._clock()
            if now - self._checked_at >= self._min_interval_s:
                self._checked_at = now
                self._reload_if_changed()
            return self._current

    def refresh(self) -> bool:
        """Looks at the files now; True when a new pair was loaded."""
        with self._lock:
            self._checked_at = self._clock()
            return self._reload_if_changed()

    def _on_hello(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        try:
            context = self.current()
        except Exception:  # a failing callback would fail the handshake: keep the pair it started with
            log.exception("serving certificate: could not look for a rotated certificate")
            return
        if context is not connection.context:
            connection.context = context

    def _reload_if_changed(self) -> bool:
        contents = self._read()
        if contents is None:
            self._note(self._unreadable())
            return False
        if contents == self._loaded:
            return False
        try:
            context = self._context(contents[0])
        except CertificateError as exc:
            self._note(f"{exc}; still serving {_describe(self.info)}")
            return False
        self._current, self._loaded = context, contents
        self.info = _info(contents[0])
        self.last_error = None
        self.reloads += 1
        log.info("serving certificate reloaded: %s", _describe(self.info))
        return True

    def _context(self, cert_pem: bytes) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # HTTP/1.1 only: the API server then keeps a pool of HTTP/1.1 connections.
        context.set_alpn_protocols(["http/1.1"])
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise CertificateError(
                f"cannot load certificate {self.cert_file!r} with key {self.key_file!r} ({exc})"
            ) from None
        try:
            _info(cert_pem)
        except ValueError as exc:
            raise CertificateError(f"certificate {self.cert_file!r} is not readable PEM ({exc})") from None
        return context

    def _read(self) -> tuple[bytes, bytes] | None:
        try:
            with open(self.cert_file, "rb") as cert, open(self.key_file, "rb") as key:
                return cert.read(), key.read()
        except OSError:
            return None

    def _unreadable(self) -> str:
        return f"cannot read --tls-cert-file {self.cert_file!r} or --tls-private-key-file {self.key_file!r}"

    def _note(self, message: str) -> None:
        if message != self.last_error:
            log.warning("serving certificate not reloaded: %s", message)
        self.last_error = message


def _info(cert_pem: bytes) -> CertificateInfo:
    cert = x509.load_pem_x509_certificate(cert_pem)  # the first in the file: the serving certificate
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns_names = tuple(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns_names = ()
    return CertificateInfo(
        subject=cert.subject.rfc4514_string(),
        dns_names=dns_names,
        not_after=cert.not_valid_after_utc,
        sha256=hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest(),
    )


def _describe(info: CertificateInfo) -> str:
    names = ", ".join(info.dns_names) or "no DNS names"
    return f"{info.subject} ({names}), valid until {info.not_after:%Y-%m-%d %H:%M}Z, sha256 {info.sha256[:16]}"

