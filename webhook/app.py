"""fgpu-webhook assembled: config, translation rules, serving certificate, decisions, HTTPS server.

`WebhookApp` owns the pieces and their order: everything that can be wrong
(the config, the rules file, the certificate, the port) fails in the
constructor, with a message naming the flag or key, before anything serves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from apis.translation import RulesWatcher, TranslationRules
from webhook.admission import Admission
from webhook.certs import ServingCertificate
from webhook.config import WebhookConfig
from webhook.errors import ConfigError
from webhook.httpserver import AsyncHTTPServer, Limits

log = logging.getLogger("fgpu-webhook")


class WebhookApp:
    def __init__(
        self,
        config: WebhookConfig,
        *,
        listen: str,
        cert_file: str,
        key_file: str,
        limits: Limits = Limits(),
        cert_check_interval_s: float = 1.0,
    ) -> None:
        host, port = _host_port(listen)
        self.rules = _rules_source(config.translation_rules)
        self.certificate = ServingCertificate(cert_file, key_file, min_interval_s=cert_check_interval_s)
        self.admission = Admission(scope=config.scope, rules=self.rules)
        self.server = AsyncHTTPServer(
            self.admission.handle, host=host or "0.0.0.0", port=port, name="fgpu-webhook", limits=limits,
            ssl_context=self.certificate.server_context(),
        )

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> None:
        self.server.start()
        host, port = self.server.address
        log.info("serving AdmissionReview v1 on https://%s:%d (/mutate, /validate, /healthz)", host, port)

    def stop(self, grace: float | None = None) -> None:
        self.server.stop(grace)


def _host_port(listen: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` (apis.tls has the same, but imports grpc: 15 MiB this process need not hold)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen={listen!r}: expected HOST:PORT, e.g. 0.0.0.0:8443 or [::]:8443")
    return host.strip("[]"), int(port)


def _rules_source(path: str) -> Callable[[], TranslationRules]:
    if not path:
        rules = TranslationRules.default()
        return lambda: rules
    return RulesWatcher(path).current  # a bad file at start raises RulesError: the operator's to fix now
