"""Fixtures of the webhook tests: a PKI, a mounted Secret, and fgpu-webhook serving HTTPS on a free port."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.webhook.client import Client
from tests.webhook.pki import CA, SecretVolume, Serving, issue, make_ca
from webhook.app import WebhookApp
from webhook.config import WebhookConfig


@dataclass
class Served:
    app: WebhookApp
    ca: CA
    serving: Serving
    volume: SecretVolume
    clients: list[Client] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.app.port

    def client(self, ca_bundle: bytes | None = None) -> Client:
        """A client, closed after the test."""
        client = Client(self.port, self.ca.pem if ca_bundle is None else ca_bundle)
        self.clients.append(client)
        return client


@pytest.fixture
def start_webhook(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Starts fgpu-webhook with a fresh CA and serving certificate; stops it after the test."""
    started: list[Served] = []

    def start(config: WebhookConfig | None = None, **kwargs: object) -> Served:
        ca = make_ca()
        serving = issue(ca)
        volume = SecretVolume(tmp_path / f"certs-{len(started)}")
        volume.write(serving)
        app = WebhookApp(config or WebhookConfig(), listen="127.0.0.1:0", cert_file=str(volume.cert_file),
                         key_file=str(volume.key_file), cert_check_interval_s=0.0, **kwargs)  # type: ignore[arg-type]
        app.start()
        served = Served(app=app, ca=ca, serving=serving, volume=volume)
        started.append(served)
        return served

    yield start
    for served in started:
        for client in served.clients:
            client.close()
        served.app.stop(1.0)


@pytest.fixture
def served(start_webhook: Callable[..., Served]) -> Served:
    return start_webhook()
