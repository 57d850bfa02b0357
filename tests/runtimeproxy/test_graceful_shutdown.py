"""Issue 14, defect 3: stopping the proxy says GOAWAY, finishes the calls it forwarded, and loses no answer.

Frame level: kubelet hears GOAWAY twice (RFC 9113 §6.8), the open call gets
its answer, a stream opened after the final GOAWAY is refused and never
reaches the runtime, and the listen path is free for a successor at once.
Process level: kubelet-like grpcio clients keep calling while the proxy
process is restarted the way systemd restarts it; every call runs exactly
once and gets its answer (retrying UNAVAILABLE, as kubelet does, is allowed).
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import h2.events
import pytest

from apis.grpc_server import add_listener, prepare_unix_socket, socket_path_lock
from tests.runtimeproxy.fakeruntime import FakeRuntime
from tests.runtimeproxy.h2peers import (
    CREATE_CONTAINER,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    connect_pair,
    create_container_request,
    frame,
    grpc_frame,
    listen_path,
    parse_create_request,
    proxy_before_h2_runtime,
    pump,
    request,
    request_headers,
    respond,
    status_of,
)
from tests.runtimeproxy.rig import ProxyRig

ROOT = str(Path(__file__).resolve().parents[2])
REFUSED_STREAM = 0x7
LAST_STREAM_ID = 2**31 - 1


def test_stopping_says_goaway_twice_answers_the_open_call_and_refuses_later_streams() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        sid = request(kubelet, "/test.Echo/Unary", grpc_frame(b"question"))
        pump([kubelet, rt], lambda: rt.ended(sid), what="the call at the runtime")
        assert rig.thread is not None
        stopped = rig.thread.stopping(grace=10)

        pump([kubelet, rt], lambda: len(kubelet.goaways) == 2, what="both GOAWAYs")
        assert kubelet.goaways == [(LAST_STREAM_ID, 0), (sid, 0)]
        # the PING between them is the proxy's: its ACK does not reach the runtime
        assert not [f for f in rt.frames_of(PING) if f.payload == kubelet.frames_of(PING)[-1].payload]
        assert not os.path.exists(listen_path(rig)), "the listen path must be free for a successor"

        late = sid + 2
        block = kubelet.conn.encoder.encode(request_headers("/test.Echo/Unary"))
        kubelet.send_raw(frame(HEADERS, END_HEADERS | END_STREAM, late, block))
        pump([kubelet, rt], lambda: kubelet.resets(late), what="the refusal of a stream after the final GOAWAY")
        assert kubelet.resets(late) == [REFUSED_STREAM]
        assert not stopped.done()

        respond(rt, sid, b"answer")
        pump([kubelet, rt], lambda: kubelet.eof, what="the answer, then the end of the connection")
        assert kubelet.body(sid)[5:] == b"answer"
        assert status_of(kubelet, sid) == (0, "")
        assert not rt.of(h2.events.RequestReceived, late)
        stopped.result(timeout=5)


def test_stopping_after_the_runtimes_goaway_never_raises_the_last_stream_id_kubelet_heard() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        taken = request(kubelet, "/test.Echo/Unary", grpc_frame(b"taken"))
        pump([kubelet, rt], lambda: rt.ended(taken), what="the call at the runtime")
        rt.send_raw(frame(GOAWAY, 0, 0, taken.to_bytes(4, "big") + b"\x00\x00\x00\x00"))
        later = request(kubelet, "/test.Echo/Unary", grpc_frame(b"above the runtime's last stream id"))
        pump([kubelet, rt], lambda: kubelet.goaways and rt.ended(later), what="the GOAWAY and the later call")
        assert rig.thread is not None
        stopped = rig.thread.stopping(grace=10)
        respond(rt, taken, b"answered")
        rt.close()  # the runtime ignored the later call, then went
        pump([kubelet], lambda: kubelet.eof, what="the end of kubelet's connection")
        stopped.result(timeout=5)
        assert kubelet.body(taken)[5:] == b"answered"
        assert [last for last, _ in kubelet.goaways if last > taken] == [], kubelet.goaways
        assert kubelet.resets(later) == [REFUSED_STREAM]  # never run: kubelet may send it again


def test_a_call_still_open_when_the_grace_ends_gets_unavailable() -> None:
    with proxy_before_h2_runtime() as (rig, runtime):
        kubelet, rt = connect_pair(rig, runtime)
        sid = request(kubelet, "/test.Echo/Unary", grpc_frame(b"never answered"))
        pump([kubelet, rt], lambda: rt.ended(sid), what="the call at the runtime")
        assert rig.thread is not None
        started = time.monotonic()
        rig.thread.stopping(grace=0.5).result(timeout=5)
        assert time.monotonic() - started < 2
        pump([kubelet, rt], lambda: kubelet.ended(sid), what="the call's end")
        code, message = status_of(kubelet, sid)
        assert code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert "shutting down" in message


def test_a_stopping_proxy_leaves_its_successors_socket_alone(fake_runtime: FakeRuntime) -> None:
    first = ProxyRig(backend=fake_runtime.address).start(admin_listen="")
    second = ProxyRig(backend=fake_runtime.address, base_dir=first.base_dir)
    try:
        with first.kubelet() as k, concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            waiting = pool.submit(k.raw, "/test.Echo/Wait", b"", timeout=1.5)  # keeps the first proxy draining
            while not any(s.method == "/test.Echo/Wait" for s in fake_runtime.seen):
                time.sleep(0.01)
            assert first.thread is not None
            draining = first.thread.stopping(grace=10)
            second.start(admin_listen="")  # binds the path the first one gave up
            with pytest.raises(grpc.RpcError):
                waiting.result(timeout=10)
            draining.result(timeout=10)
        with second.kubelet() as k:
            assert k.raw("/test.Echo/Unary", b"served by the successor")[0] == b"served by the successor"
    finally:
        first.stop()
        second.stop()


def test_a_successor_binding_while_its_predecessor_removes_the_socket_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The predecessor's removal lands between the successor's check and its own removal.
    path = str(tmp_path / "proxy.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    real_lstat = os.lstat

    def lstat_then_owner_removes(p: str) -> os.stat_result:
        st = real_lstat(p)
        if p == path and os.path.exists(path):
            os.unlink(path)
        return st

    monkeypatch.setattr(os, "lstat", lstat_then_owner_removes)
    prepare_unix_socket(path)
    monkeypatch.undo()
    assert not os.path.exists(path)
    stale.close()


def test_a_stopping_proxy_checks_and_removes_its_socket_under_the_directory_lock(fake_runtime: FakeRuntime) -> None:
    # Else a successor could unlink and bind between the check and the removal, and lose its socket.
    rig = ProxyRig(backend=fake_runtime.address).start(admin_listen="")
    assert rig.thread is not None
    path = rig.listen.removeprefix("unix://")
    try:
        with socket_path_lock(path):
            stopping = rig.thread.stopping(grace=0.2)
            time.sleep(0.3)
            assert os.path.exists(path) and not stopping.done()
        stopping.result(timeout=10)
        assert not os.path.exists(path)
    finally:
        rig.stop()


# --- a process restarted under load ---------------------------------------------------------------------


@dataclass
class OnceRuntime:
    """A runtime on which each call must run once: a repeated id fails with ALREADY_EXISTS, like
    containerd's "name is reserved" for a CreateContainer that already ran."""

    socket_path: str
    ran: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: grpc.Server | None = None

    def start(self) -> OnceRuntime:
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=32))
        self.server.add_generic_rpc_handlers((_OnceHandler(self),))
        add_listener(self.server, f"unix://{self.socket_path}")
        self.server.start()
        return self

    def run_once(self, key: str, context: grpc.ServicerContext) -> None:
        time.sleep(random.uniform(0.0, 0.04))
        with self.lock:
            self.ran[key] += 1
            again = self.ran[key] > 1
        if again:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"{key} is reserved: it ran already")


class _OnceHandler(grpc.GenericRpcHandler):
    def __init__(self, owner: OnceRuntime) -> None:
        self.owner = owner

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        def once(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.owner.run_once(request.decode(), context)
            return request

        def create(request: bytes, context: grpc.ServicerContext) -> bytes:
            name = parse_create_request(request).config.metadata.name
            self.owner.run_once(name, context)
            return b"\x0a" + bytes([len(name)]) + name.encode()

        return grpc.unary_unary_rpc_method_handler(create if details.method == CREATE_CONTAINER else once)


@pytest.fixture
def once_runtime() -> Iterator[OnceRuntime]:
    runtime = OnceRuntime(os.path.join(tempfile.mkdtemp(prefix="fgpu-once-", dir="/tmp"), "runtime.sock")).start()
    yield runtime
    assert runtime.server is not None
    runtime.server.stop(grace=None)


def _start_proxy(listen: str, backend: str, hook_dir: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "runtimeproxy.main", "--listen", f"unix://{listen}", "--backend", backend,
         "--hook-config-dir", hook_dir, "--admin-listen", "", "--metrics-listen", ""],
        cwd=ROOT, stderr=subprocess.DEVNULL,
    )


def _serving(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(path)
        except OSError:
            return False
        return True


def _wait_serving(path: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not _serving(path):
        assert time.monotonic() < deadline, "the proxy did not start serving"
        time.sleep(0.01)


@dataclass
class _Client:
    """A kubelet-like caller: one connection, calls in a loop, UNAVAILABLE retried with the same request."""

    index: int
    listen: str
    answered: list[str] = field(default_factory=list)
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    retries: int = 0

    def run(self, stop: threading.Event) -> None:
        options = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", 200)]
        with grpc.insecure_channel(f"unix://{self.listen}", options) as ch:
            once = ch.unary_unary("/test.Once/Call")
            create = ch.unary_unary(CREATE_CONTAINER)
            n = 0
            while not stop.is_set():
                key = f"c{self.index}-{n}"
                n += 1
                if n % 3:
                    call, payload, want = once, key.encode(), key.encode()
                else:
                    call, payload = create, create_container_request(name=key)
                    want = b"\x0a" + bytes([len(key)]) + key.encode()
                self._call(call, key, payload, want)

    def _call(self, call: grpc.UnaryUnaryMultiCallable, key: str, payload: bytes, want: bytes) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                got = call(payload, timeout=10)
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline:
                    self.retries += 1
                    time.sleep(0.02)
                    continue
                self.failures.append((key, str(exc.code()), exc.details() or ""))
                return
            if got != want:
                self.failures.append((key, "wrong answer", repr(got)))
            self.answered.append(key)
            return


@pytest.mark.slow
def test_restarting_the_proxy_process_under_load_loses_no_answer_and_runs_no_call_twice(
    once_runtime: OnceRuntime, tmp_path: Path
) -> None:
    listen = str(tmp_path / "proxy.sock")
    hook_dir = str(tmp_path / "hooks.d")
    backend = f"unix://{once_runtime.socket_path}"
    proc = _start_proxy(listen, backend, hook_dir)
    _wait_serving(listen)
    clients = [_Client(i, listen) for i in range(6)]
    stop = threading.Event()
    threads = [threading.Thread(target=c.run, args=(stop,)) for c in clients]
    for t in threads:
        t.start()
    gaps: list[float] = []
    try:
        time.sleep(1.0)
        for _ in range(2):
            # systemd's restart: SIGTERM, wait for the exit, start the new process
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0
            proc = _start_proxy(listen, backend, hook_dir)
            _wait_serving(listen)
            gaps.append(time.monotonic() - began)
            time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    failures = [f for c in clients for f in c.failures]
    answered = [key for c in clients for key in c.answered]
    assert failures == []
    assert len(answered) > 100
    ran_twice = [key for key, times in once_runtime.ran.items() if times > 1]
    assert ran_twice == []
    assert sorted(answered) == sorted(once_runtime.ran)
    # the successor listens again as soon as the old process is out and Python is up
    assert max(gaps) < 8, gaps
