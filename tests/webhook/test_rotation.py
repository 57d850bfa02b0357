"""A rotated serving certificate is used by new handshakes without a restart; a broken rotation is not applied."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from tests.webhook.client import Client
from tests.webhook.conftest import Served
from tests.webhook.pki import SecretVolume, issue, make_ca
from tests.webhook.reviews import pod, review
from webhook.certs import ServingCertificate
from webhook.errors import CertificateError


def serial_seen(served: Served, ca_bundle: bytes | None = None) -> int:
    client = served.client(ca_bundle)
    try:
        return client.request("GET", "/healthz").peer.serial_number
    finally:
        client.close()


def test_a_rotated_certificate_serves_new_connections_and_open_ones_carry_on(served: Served) -> None:
    before = served.client()
    assert before.request("GET", "/healthz").peer.serial_number == served.serving.serial
    renewed = issue(served.ca)
    served.volume.write(renewed)
    assert serial_seen(served) == renewed.serial
    # The connection opened before the rotation keeps its session, and keeps working.
    assert before.post("/mutate", review(pod()))["response"]["allowed"] is True
    assert served.app.certificate.reloads == 1


def test_a_new_ca_is_trusted_once_the_ca_bundle_carries_both(served: Served) -> None:
    old_bundle = served.ca.pem
    new_ca = make_ca("fgpu-webhook CA 2")
    both = old_bundle + new_ca.pem  # the bundle the chain's owner publishes before it switches
    assert serial_seen(served, both) == served.serving.serial
    renewed = issue(new_ca)
    served.volume.write(renewed)
    assert serial_seen(served, both) == renewed.serial
    with pytest.raises(ssl.SSLCertVerificationError):
        serial_seen(served, old_bundle)  # a client left with the old bundle alone refuses the new chain


def test_a_key_that_does_not_match_keeps_the_old_pair_until_the_right_key_arrives(served: Served) -> None:
    renewed = issue(served.ca)
    served.volume.write(renewed, key_pem=served.serving.key_pem)  # halfway: new certificate, old key
    assert serial_seen(served) == served.serving.serial
    assert served.app.certificate.last_error is not None
    assert "still serving" in served.app.certificate.last_error
    served.volume.write(renewed)
    assert serial_seen(served) == renewed.serial
    assert served.app.certificate.last_error is None


@pytest.mark.parametrize("garbage", [b"", b"-----BEGIN CERTIFICATE-----\nnope\n", b"\x00" * 100])
def test_an_unreadable_certificate_keeps_the_old_pair(served: Served, garbage: bytes) -> None:
    served.volume.write(issue(served.ca), key_pem=garbage)
    assert serial_seen(served) == served.serving.serial


def test_files_gone_keep_the_old_pair(served: Served) -> None:
    for link in (served.volume.cert_file, served.volume.key_file):
        link.unlink()
    assert serial_seen(served) == served.serving.serial
    assert "cannot read" in (served.app.certificate.last_error or "")


def test_the_files_are_looked_at_at_most_once_per_interval(tmp_path: Path) -> None:
    ca = make_ca()
    volume = SecretVolume(tmp_path)
    volume.write(issue(ca))
    now = [100.0]
    certificate = ServingCertificate(str(volume.cert_file), str(volume.key_file), min_interval_s=5.0, clock=lambda: now[0])
    first = certificate.current()
    volume.write(issue(ca))
    now[0] += 4.9
    assert certificate.current() is first
    now[0] += 0.2
    assert certificate.current() is not first
    assert certificate.reloads == 1


def test_a_rewrite_with_the_same_content_is_no_reload(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path)
    serving = issue(make_ca())
    volume.write(serving)
    certificate = ServingCertificate(str(volume.cert_file), str(volume.key_file), min_interval_s=0.0)
    volume.write(serving)
    assert certificate.refresh() is False


def test_bad_files_at_start_are_an_error_naming_the_flags(tmp_path: Path) -> None:
    with pytest.raises(CertificateError, match="--tls-cert-file"):
        ServingCertificate(str(tmp_path / "missing.crt"), str(tmp_path / "missing.key"))
    volume = SecretVolume(tmp_path / "v")
    volume.write(issue(make_ca()), key_pem=b"not a key")
    with pytest.raises(CertificateError, match="cannot load certificate"):
        ServingCertificate(str(volume.cert_file), str(volume.key_file))


def test_a_client_without_sni_gets_the_rotated_certificate_too(served: Served) -> None:
    renewed = issue(served.ca)
    served.volume.write(renewed)
    context = ssl.create_default_context(cadata=served.ca.pem.decode())
    context.check_hostname = False  # no SNI is sent for an IP address; the chain is still verified
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=None) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None and x509.load_der_x509_certificate(der).serial_number == renewed.serial


def test_a_client_object_is_reusable_across_rotations(served: Served) -> None:
    client = Client(served.port, served.ca.pem)
    client.request("GET", "/healthz")
    client.close()
    served.volume.write(issue(served.ca))
    assert client.request("GET", "/healthz").status == 200
    client.close()
