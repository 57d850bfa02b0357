"""The proxy as its own process, between h2 peers the test drives: the listener the proxy dials, the hook gate.

    proxy = ProxyProcess(base_dir, hook_endpoint=hook.endpoint).start()
    pair = proxy.connect()            # kubelet -> proxy -> runtime, both ends h2, settings exchanged
    ...
    proxy.stop()

The runtime end is a plain listening unix socket: each kubelet connection
makes the proxy dial it once, and `connect()` accepts that connection and
wraps it in a server-side `Peer`, so every frame of both connections is in
the test's hands.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import h2.events

from apis.fgpu.v1 import hooks_pb2
from tests.runtimeproxy.h2conformance.peers import Credit, Pair, Peer, pump
from tests.runtimeproxy.hookserver import write_hook_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class ProxyProcess:
    """`python -m runtimeproxy.main` in front of `runtime.sock`, with one PreCreateContainer hook registered."""

    def __init__(self, base_dir: str, *, hook_endpoint: str) -> None:
        self.base_dir = base_dir
        self.listen_path = os.path.join(base_dir, "proxy.sock")
        self.backend_path = os.path.join(base_dir, "runtime.sock")
        self.hook_dir = os.path.join(base_dir, "hooks.d")
        self.log_path = os.path.join(base_dir, "proxy.log")
        self.hook_endpoint = hook_endpoint
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc: subprocess.Popen[bytes] | None = None
        self.peers: list[Peer] = []
        self._log_mark = 0

    def start(self) -> ProxyProcess:
        write_hook_config(self.hook_dir, name="h2-test-hook", endpoint=self.hook_endpoint,
                          stages=["PreCreateContainer"], policy="Ignore", timeout="20s")
        if not os.path.exists(self.backend_path):
            self.listener.bind(self.backend_path)
            self.listener.listen(64)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runtimeproxy.main", "--listen", f"unix://{self.listen_path}",
                 "--backend", f"unix://{self.backend_path}", "--hook-config-dir", self.hook_dir,
                 "--admin-listen", "", "--metrics-listen", "", "--backend-dial-timeout", "1s", "--log-level", "info"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 20
        while not os.path.exists(self.listen_path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the proxy did not start:\n{self.log_tail()}")
            time.sleep(0.02)
        return self

    # --- health ------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def mark_log(self) -> None:
        self._log_mark = os.path.getsize(self.log_path)

    def log_since_mark(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_mark)
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        with open(self.log_path, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])

    def problems(self) -> str:
        """Why the proxy is not healthy since the last mark ("" when it is): dead, or a traceback logged."""
        if not self.alive:
            return f"the proxy process exited with {self.proc.returncode if self.proc else None}:\n{self.log_tail()}"
        text = self.log_since_mark()
        if "Traceback" in text or "Exception in callback" in text or "Fatal error" in text:
            return f"the proxy logged an unhandled exception:\n{text[-4000:]}"
        return ""

    # --- connections -------------------------------------------------------------------------------

    def dial(self, *, name: str = "kubelet", credit: Credit = Credit.PROMPT) -> Peer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        sock.connect(self.listen_path)
        client = Peer(sock, client_side=True, name=name, credit=credit)
        self.peers.append(client)
        client.conn.initiate_connection()
        client.flush()
        return client

    def accept(self, *, name: str = "runtime", credit: Credit = Credit.PROMPT, timeout: float = 5.0) -> Peer:
        self.listener.settimeout(timeout)
        sock, _ = self.listener.accept()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        runtime = Peer(sock, client_side=False, name=name, credit=credit)
        self.peers.append(runtime)
        return runtime

    def connect(self, *, client_credit: Credit = Credit.PROMPT, runtime_credit: Credit = Credit.PROMPT,
                runtime_settings: dict[Any, int] | None = None, suffix: str = "") -> Pair:
        """A kubelet connection and its runtime connection, with the settings exchanged and acknowledged."""
        client = self.dial(name="kubelet" + suffix, credit=client_credit)
        while True:
            runtime = self.accept(name="runtime" + suffix, credit=runtime_credit)
            # a connection the proxy dialed for an earlier, closed client ends before any preface
            pump([runtime], _preface_or_eof(runtime), what="the client's preface at the runtime")
            if not runtime.eof:
                break
        runtime.conn.initiate_connection()
        if runtime_settings:
            runtime.conn.update_settings(runtime_settings)
        runtime.flush()
        want = 2 if runtime_settings else 1
        pair = Pair(client, runtime)
        pair.pump(lambda: runtime.of(h2.events.RemoteSettingsChanged)
                  and len(client.of(h2.events.RemoteSettingsChanged)) >= want
                  and client.of(h2.events.SettingsAcknowledged)
                  and len(runtime.of(h2.events.SettingsAcknowledged)) >= want,
                  what="the settings exchange")
        return pair

    def close_all(self) -> None:
        """Closes the test's peers and the runtime connections it never accepted (a stray dial must not
        reach the next test)."""
        for peer in self.peers:
            peer.close()
        self.peers.clear()
        self.listener.setblocking(False)
        try:
            while True:
                sock, _ = self.listener.accept()
                sock.close()
        except (BlockingIOError, OSError):
            pass
        finally:
            self.listener.setblocking(True)

    def terminate(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.listener.close()


def _preface_or_eof(runtime: Peer) -> Callable[[], bool]:
    return lambda: bool(runtime.of(h2.events.RemoteSettingsChanged)) or runtime.eof


class Gate:
    """A PreCreateContainer answer held until `open()`: keeps an intercepted call held in the proxy."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.entered = threading.Event()
        #: when set, the held answer is this rejection (the proxy then refuses the call itself)
        self.reject = ""

    def __call__(self, request: hooks_pb2.ContainerHookRequest) -> hooks_pb2.HookResponse:
        self.entered.set()
        self.opened.wait(30)
        if self.reject:
            return hooks_pb2.HookResponse(rejection=hooks_pb2.Rejection(reason=self.reject))
        return hooks_pb2.HookResponse()

    def wait_entered(self, pair: Pair | None = None, timeout: float = 5.0) -> None:
        """Waits until the hook holds the call, reading both peers meanwhile (nothing must stall on us)."""
        if pair is None:
            assert self.entered.wait(timeout), "the hook was never called"
            return
        pump(pair.peers, self.entered.is_set, timeout=timeout, what="the hook call")

    def open(self) -> None:
        self.opened.set()
