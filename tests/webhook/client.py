"""An HTTPS client that checks the webhook as the API server does: the chain against the caBundle, the Service name."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from tests.webhook.pki import SERVICE_DNS


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes
    #: the certificate the server presented
    peer: x509.Certificate

    def review(self) -> dict[str, Any]:
        assert self.status == 200, (self.status, self.body)
        assert self.content_type == "application/json"
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


def ca_context(ca_bundle: bytes) -> ssl.SSLContext:
    """Trusts only the caBundle; checks the name (the API server dials <service>.<namespace>.svc)."""
    context = ssl.create_default_context(cadata=ca_bundle.decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class _Connection(http.client.HTTPSConnection):
    """Dials 127.0.0.1 but verifies (and sends SNI for) the Service's DNS name."""

    def __init__(self, port: int, context: ssl.SSLContext, server_name: str, timeout: float) -> None:
        super().__init__(server_name, port, context=context, timeout=timeout)
        self._tls = context
        self._server_name = server_name

    def connect(self) -> None:
        raw = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        # As Go's net/http does: http.client sends head and body apart, and Nagle would hold the body back.
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self._server_name)


class Client:
    """One keep-alive connection, as the API server keeps a pool of them."""

    def __init__(self, port: int, ca_bundle: bytes, *, server_name: str = SERVICE_DNS, timeout: float = 10.0) -> None:
        self._conn = _Connection(port, ca_context(ca_bundle), server_name, timeout)

    def request(self, method: str, path: str, body: bytes | None = None) -> Answer:
        headers = {"Content-Type": "application/json", "Accept": "application/json"} if body is not None else {}
        self._conn.request(method, path, body=body, headers=headers)
        response = self._conn.getresponse()
        data = response.read()
        assert self._conn.sock is not None
        der = self._conn.sock.getpeercert(binary_form=True)
        assert der is not None
        return Answer(response.status, response.getheader("Content-Type") or "", data, x509.load_der_x509_certificate(der))

    def post(self, path: str, review: dict[str, Any]) -> dict[str, Any]:
        """The AdmissionReview answered, as the API server posts it (with ?timeout=)."""
        return self.request("POST", f"{path}?timeout=10s", json.dumps(review).encode()).review()

    def close(self) -> None:
        self._conn.close()
