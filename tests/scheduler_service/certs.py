"""A throwaway PKI for the TLS tests: a CA, a server certificate, client certificates, made with `cryptography`."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from apis.tls import TLSFiles


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


@dataclass(frozen=True)
class PKI:
    """PEM files under one directory: `ca` signed `server` and `client`; `rogue` signed `stranger`."""

    ca: Path
    server: Issued
    client: Issued
    rogue_ca: Path
    stranger: Issued

    def server_files(self) -> TLSFiles:
        """The scheduler's side: its certificate, and the CA its clients must chain to."""
        return TLSFiles(cert_file=str(self.server.cert), key_file=str(self.server.key), ca_file=str(self.ca))

    def client_files(self, issued: Issued | None = None) -> TLSFiles:
        """A client's side: its certificate (the good client's by default) and the server's CA."""
        who = issued or self.client
        return TLSFiles(cert_file=str(who.cert), key_file=str(who.key), ca_file=str(self.ca))


def make_pki(directory: Path) -> PKI:
    ca_key, ca_cert = _ca("fgpu test CA")
    rogue_key, rogue_cert = _ca("someone else's CA")
    ca_path = _write_cert(directory / "ca.crt", ca_cert)
    rogue_path = _write_cert(directory / "rogue-ca.crt", rogue_cert)
    server = _issue(directory, "server", ca_key, ca_cert, server=True)
    client = _issue(directory, "client", ca_key, ca_cert, server=False)
    stranger = _issue(directory, "stranger", rogue_key, rogue_cert, server=False)
    return PKI(ca=ca_path, server=server, client=client, rogue_ca=rogue_path, stranger=stranger)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _ca(name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _issue(
    directory: Path, name: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, *, server: bool
) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fgpu-{name}")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    key_path = directory / f"{name}.key"
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return Issued(cert=_write_cert(directory / f"{name}.crt", cert), key=key_path)


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path
