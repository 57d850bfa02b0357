"""`fgpu-webhook`: the admission webhook's command line.

    fgpu-webhook --listen HOST:PORT --tls-cert-file FILE --tls-private-key-file FILE [--config FILE]

Serves AdmissionReview v1 over HTTPS on POST /mutate and POST /validate,
health on GET /healthz. The certificate files are re-read when they change
(rotation restarts nothing); the config file is read once (webhook/config.py),
the translation rules file it names whenever it changes. Stops cleanly on
SIGTERM/SIGINT: no new connections, requests being read get `--shutdown-grace`.
Exit status: 0 after a clean stop, 2 when the flags, the config, the rules or
the certificate cannot be used.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from apis import names
from apis.translation import RulesError
from webhook import config as config_mod
from webhook.app import WebhookApp
from webhook.config import WebhookConfig
from webhook.errors import WebhookError

log = logging.getLogger("fgpu-webhook")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fgpu-webhook",
        description=f"fgpu admission webhook: sets {names.SCHEDULER_NAME} on GPU pods, refuses invalid GPU requests.",
    )
    p.add_argument("--listen", metavar="HOST:PORT", default="0.0.0.0:8443", help="HTTPS address (default %(default)s)")
    p.add_argument("--tls-cert-file", metavar="FILE", required=True,
                   help="serving certificate (PEM, intermediates after it); re-read when it changes")
    p.add_argument("--tls-private-key-file", metavar="FILE", required=True, help="its private key (PEM)")
    p.add_argument("--config", metavar="FILE", help="YAML config: translationRules, schedulerInjection")
    p.add_argument("--shutdown-grace", metavar="SECONDS", type=float, default=5.0,
                   help="on SIGTERM, how long requests being read may take (default %(default)s)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_mod.load(args.config) if args.config else WebhookConfig()
        app = WebhookApp(config, listen=args.listen, cert_file=args.tls_cert_file, key_file=args.tls_private_key_file)
    except (WebhookError, RulesError, OSError) as exc:
        print(f"fgpu-webhook: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    app.start()
    try:
        stop.wait()
    finally:
        app.stop(args.shutdown_grace)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
