"""A throwaway PKI as the chart's certificate Job makes one, and a Secret volume that rotates as the kubelet does.

The CA signs a serving certificate for the webhook Service's DNS names (and
127.0.0.1, where the tests dial). The CA's PEM is the webhook configurations'
`caBundle`: clients verify the chain against it, as the API server does.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: The name the API server dials: <service>.<namespace>.svc
SERVICE_DNS = "fgpu-webhook.fgpu-system.svc"


@dataclass(frozen=True)
class CA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def pem(self) -> bytes:
        """What goes into caBundle (base64-encoded there)."""
        return self.cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Serving:
    cert: x509.Certificate
    cert_pem: bytes
    key_pem: bytes

    @property
    def serial(self) -> int:
        return self.cert.serial_number


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(name: str = "fgpu-webhook CA") -> CA:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
    return CA(key=key, cert=cert)


def issue(ca: CA, *, dns: tuple[str, ...] = (SERVICE_DNS, "fgpu-webhook.fgpu-system.svc.cluster.local"),
          days: int = 90) -> Serving:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[0])]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName([*(x509.DNSName(d) for d in dns), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return Serving(cert=cert, cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=key_pem)


class SecretVolume:
    """A mounted `kubernetes.io/tls` Secret: tls.crt and tls.key, swapped together as the kubelet swaps them.

    The kubelet (AtomicWriter) writes a new timestamped directory, points a
    temporary `..data_tmp` symlink at it and renames that over `..data`; the
    visible files are symlinks through `..data`.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.generation = 0
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def cert_file(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.directory / "tls.key"

    def write(self, serving: Serving, *, key_pem: bytes | None = None) -> None:
        self.generation += 1
        payload = self.directory / f"..2024_01_01_00_00_{self.generation:02d}.000000001"
        payload.mkdir()
        (payload / "tls.crt").write_bytes(serving.cert_pem)
        (payload / "tls.key").write_bytes(serving.key_pem if key_pem is None else key_pem)
        tmp = self.directory / "..data_tmp"
        tmp.symlink_to(payload.name)
        os.replace(tmp, self.directory / "..data")
        for name in ("tls.crt", "tls.key"):
            link = self.directory / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
