"""Run the double on its own, for the local demo or a manual `kubectl --kubeconfig`:

python -m tests.kubeapi --port 6443 --crd hack/deploy/crds/device.yaml
"""

from __future__ import annotations

import argparse
import signal
import threading

from tests.kubeapi.server import DEVICE_CRD, KubeAPIServer


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.kubeapi", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: any free port)")
    parser.add_argument(
        "--crd", action="append", default=None, help=f"CRD manifest to install (default: {DEVICE_CRD})"
    )
    parser.add_argument("--history", type=int, default=1000, help="changes kept for watch resume")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with KubeAPIServer(history=args.history, port=args.port) as server:
        for manifest in args.crd or [DEVICE_CRD]:
            server.install_crd(manifest)
        print(f"serving {server.url}; kubeconfig: {server.kubeconfig_path}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
