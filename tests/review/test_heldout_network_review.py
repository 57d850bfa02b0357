"""Held-out review of what an unauthenticated client on the pod network can do to fgpu's listeners.

Pod authors are not trusted and reach every port of the cluster network that asks for no
credentials, the node's own addresses included (so every hostNetwork daemon's TCP ports).
The scheduler's extender and probe listeners bound what one client may hold
(apis/httpserver.py, tests/scheduler_service/test_http_limits.py) and the webhook's
does too (webhook/httpserver.py). The tests under "defects" were written failing (strict xfail),
each an action such a pod could take, and their markers removed with the fixes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

from apis import tls
from fgpuctl import ui_server, ui_sources
from tests.agent.test_agent_daemon import Running, running  # noqa: F401 - a fixture
from tests.kubeapi import KubeAPIServer
from tests.scheduler_service.certs import make_pki

#: Half-sent requests held open: a few pods each open this many from the pod network.
HELD = 48
#: What a bounded server may spend on them: the scheduler's probe listener holds none (a connection
#: costs a socket and a buffer until its request has arrived) and takes 8 from one address at most.
THREAD_ALLOWANCE = 16
#: A request's head that never ends (slowloris): no blank line follows.
PARTIAL = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "


def _hold(address: tuple[str, int], count: int, first: bytes = PARTIAL) -> list[socket.socket]:
    """`count` connections to `address`, each having sent `first`; dialled side by side, since a server with
    a short listen backlog makes each dial that overflows it wait a SYN retry of a second or more."""

    def dial(_: int) -> socket.socket | None:
        try:
            s = socket.create_connection(address, timeout=5)
            if first:
                s.sendall(first)
            return s
        except OSError:
            return None  # refused or reset: the server bounded us, which is what is asked

    with futures.ThreadPoolExecutor(max_workers=16) as pool:
        return [s for s in pool.map(dial, range(count)) if s is not None]


def _growth(threads: Callable[[], int], baseline: int) -> int:
    """How far `threads()` rose above `baseline`: at once past the allowance, else the most seen in 2 s."""
    deadline = time.monotonic() + 2.0
    grown = threads() - baseline
    while grown <= THREAD_ALLOWANCE and time.monotonic() < deadline:
        time.sleep(0.1)
        grown = max(grown, threads() - baseline)
    return grown


def _threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError(f"no Threads: line for pid {pid}")


def _wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answered on 127.0.0.1:{port} in {timeout}s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- defects ---------------------------------------------------------------------------------


def test_agent_metrics_port_on_the_node_holds_no_thread_per_idle_connection(running: Running) -> None:  # noqa: F811
    """The chart runs the agent with hostNetwork and `metricsListen: 0.0.0.0:9400`: every pod reaches
    `<node IP>:9400`. A pod that opens connections and never finishes a request must not make the agent
    hold a thread (and a descriptor) for each, forever: enough of them and the agent, which shares its
    process with the GPU hook every GPU container's creation waits for, cannot start threads or open
    files. The scheduler's probe listener, on the pod network for the same reason, holds none."""
    port = running.agent.metrics_port
    assert port, "the fixture runs the agent with a metrics listener"
    baseline = threading.active_count()
    held = _hold(("127.0.0.1", port), HELD)
    try:
        grown = _growth(threading.active_count, baseline)
        assert grown <= THREAD_ALLOWANCE, (
            f"{len(held)} half-sent requests to the agent's metrics port already hold {grown} threads of the agent "
            f"(at most {THREAD_ALLOWANCE} expected): one thread each, with no read deadline"
        )
    finally:
        for s in held:
            s.close()


def test_descheduler_metrics_port_holds_no_thread_per_idle_connection(kube_api: KubeAPIServer) -> None:
    """The chart runs fgpu-descheduler (`--metrics-port=9403`, every interface, a Service, no
    NetworkPolicy) on the pod network. Half-sent requests from any pod must not cost it a thread each."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from scheduler_plugin.descheduler.main import main; sys.exit(main(sys.argv[1:]))",
            "--kubeconfig",
            kube_api.kubeconfig_path,
            f"--metrics-port={port}",
            "--interval=60",
            "--namespace=fgpu-system",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    held: list[socket.socket] = []
    try:
        try:
            _wait_port(port)
        except AssertionError:
            proc.kill()
            _out, err = proc.communicate(timeout=5)
            raise AssertionError(f"fgpu-descheduler did not serve metrics: {err.decode()[-2000:]}") from None
        baseline = _threads_of(proc.pid)
        held = _hold(("127.0.0.1", port), HELD)
        grown = _growth(lambda: _threads_of(proc.pid), baseline)
        assert grown <= THREAD_ALLOWANCE, (
            f"{len(held)} half-sent requests to fgpu-descheduler's metrics port already hold {grown} of its threads "
            f"(at most {THREAD_ALLOWANCE} expected)"
        )
    finally:
        for s in held:
            s.close()
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_ui_beyond_loopback_holds_no_thread_for_a_client_that_never_handshakes(tmp_path: Path) -> None:
    """`fgpuctl ui --listen 0.0.0.0:9447` with --tls-* is the documented way to show the view beyond
    loopback; mutual TLS keeps strangers from reading it. But a stranger that connects and never starts
    its handshake is given a thread (ThreadingHTTPServer, handshake in the request's thread, no
    timeout) before any certificate is asked for: unauthenticated, it can pile up threads until the view
    stops answering its operator."""
    pki = make_pki(tmp_path)
    context = tls.server_ssl_context(pki.server_files(), field="--listen")
    seeded = ui_sources.from_snapshot_file(str(Path(__file__).parents[1] / "webview" / "seeded_cluster.json"))
    state = ui_server.ViewState(seeded, interval_s=3600, history_s=3600)
    server = ui_server.UIServer(state, host="127.0.0.1", port=0, ssl_context=context)
    server.start()
    held: list[socket.socket] = []
    try:
        baseline = threading.active_count()
        held = _hold(server.address, HELD, first=b"")
        grown = _growth(threading.active_count, baseline)
        assert grown <= THREAD_ALLOWANCE, (
            f"{len(held)} connections that never start TLS already hold {grown} threads of fgpuctl ui "
            f"(at most {THREAD_ALLOWANCE} expected)"
        )
    finally:
        for s in held:
            s.close()
        server.stop(1.0)
