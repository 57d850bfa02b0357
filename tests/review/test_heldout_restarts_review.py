"""Held-out review of the runtime proxy's stop and restart behaviour, beyond tests/runtimeproxy/test_graceful_shutdown.py.

Defects found: the calls cut when the grace ended were nowhere in the log, and a
draining proxy's admin server (grpc-core unlinks its unix path on stop) removed
the admin socket its successor had bound. Also covered: a stop while the
runtime is down. Tried without a defect (kept out of here): SIGTERM or SIGINT
while a hook holds a CreateContainer it never answers (UNAVAILABLE at the
grace, no body at the runtime, exit 0); a second SIGTERM/SIGINT during the
drain (ignored; exit 0 at the grace); SIGTERM with the runtime hung before its
SETTINGS; the runtime restarting under an open kubelet connection.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.runtimeproxy.fakeruntime import FakeRuntime
from tests.runtimeproxy.h2conformance import grpcwire as g
from tests.runtimeproxy.h2conformance.peers import Peer, pump
from tests.runtimeproxy.rig import ProxyRig


@pytest.fixture
def fake_runtime() -> Iterator[FakeRuntime]:
    runtime = FakeRuntime(socket_path=os.path.join(tempfile.mkdtemp(prefix="fgpu-rv-rt-", dir="/tmp"), "rt.sock")).start()
    yield runtime
    runtime.stop()


def _cut_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and "grace" in r.getMessage()]


@pytest.fixture
def logged_rig(fake_runtime: FakeRuntime, caplog: pytest.LogCaptureFixture) -> Iterator[ProxyRig]:
    """An in-process proxy (no admin socket) whose log the test reads; stopped after the test."""
    caplog.set_level(logging.INFO, logger="runtimeproxy")
    rig = ProxyRig(backend=fake_runtime.address).start(admin_listen="")
    assert rig.thread is not None
    yield rig
    rig.stop()


def test_calls_cut_when_the_grace_ends_are_named_in_the_log(
    logged_rig: ProxyRig, fake_runtime: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    # A call kubelet sees fail with UNAVAILABLE during a restart must be traceable in the proxy's
    # journal; "stopped" alone does not say that anything was cut.
    assert logged_rig.thread is not None
    with logged_rig.kubelet() as k, concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        waiting = pool.submit(k.raw, "/test.Echo/Wait", b"", timeout=10)
        deadline = time.monotonic() + 5
        while not any(s.method == "/test.Echo/Wait" for s in fake_runtime.seen):
            assert time.monotonic() < deadline, "the call never reached the runtime"
            time.sleep(0.01)
        logged_rig.thread.stopping(grace=0.3).result(timeout=5)
        with pytest.raises(grpc.RpcError) as err:
            waiting.result(timeout=5)
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    (record,) = _cut_warnings(caplog)
    fields = getattr(record, "fields", {})
    assert fields.get("calls") == 1, fields
    assert "/test.Echo/Wait" in str(fields.get("methods")), fields


def test_a_drain_that_finishes_in_time_reports_no_cut_calls(logged_rig: ProxyRig, caplog: pytest.LogCaptureFixture) -> None:
    assert logged_rig.thread is not None
    with logged_rig.kubelet() as k:
        assert k.raw("/test.Echo/Unary", b"done before the stop")[0] == b"done before the stop"
        logged_rig.thread.stopping(grace=0.3).result(timeout=5)
    assert _cut_warnings(caplog) == []
    assert any(r.getMessage() == "runtime proxy stopped" for r in caplog.records)


def test_a_successor_keeps_its_admin_socket_when_its_draining_predecessor_stops(fake_runtime: FakeRuntime) -> None:
    # grpc-core unlinks a unix listener's path when the server stops; by then the path may be the successor's.
    first = ProxyRig(backend=fake_runtime.address).start()
    second = ProxyRig(backend=fake_runtime.address, base_dir=first.base_dir)
    admin = os.path.join(first.base_dir, "admin.sock")
    try:
        with first.kubelet() as k, concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            waiting = pool.submit(k.raw, "/test.Echo/Wait", b"", timeout=0.6)  # keeps the first one draining
            deadline = time.monotonic() + 5
            while not any(s.method == "/test.Echo/Wait" for s in fake_runtime.seen):
                assert time.monotonic() < deadline, "the call never reached the runtime"
                time.sleep(0.01)
            assert first.thread is not None
            draining = first.thread.stopping(grace=10)
            second.start()
            successors = os.stat(admin).st_ino
            with pytest.raises(grpc.RpcError):
                waiting.result(timeout=5)
            draining.result(timeout=5)
        assert os.path.exists(admin) and os.stat(admin).st_ino == successors
        with grpc.insecure_channel(f"unix://{admin}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        first.stop()
        second.stop()
    assert not os.path.exists(admin), "the last proxy to stop removes its admin socket"


def test_stopping_while_the_runtime_is_down_ends_at_once_and_leaves_kubelets_call_to_retry(tmp_path: Path) -> None:
    # containerd down: the kubelet connection is still dialling it (retrying for up to 30 s); the stop must
    # not wait for that, and the call never left the proxy, so kubelet hears it may send it elsewhere.
    rig = ProxyRig(backend=f"unix://{tmp_path}/absent.sock", backend_dial_timeout_s=30.0).start(admin_listen="")
    assert rig.thread is not None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(rig.listen.removeprefix("unix://"))
        kubelet = Peer(sock, client_side=True, name="kubelet")
        kubelet.conn.initiate_connection()
        kubelet.flush()
        sid = g.request(kubelet, g.VERSION, g.VERSION_REQUEST)
        time.sleep(0.2)  # the proxy is dialling the runtime
        started = time.monotonic()
        rig.thread.stopping(grace=10).result(timeout=5)
        assert time.monotonic() - started < 2
        pump([kubelet], lambda: kubelet.eof, what="the end of kubelet's connection")
        assert [f.last_stream_id for f in kubelet.goaways] == [0]
        assert kubelet.headers(sid) == [] and kubelet.reset(sid) is None
    finally:
        sock.close()
        rig.stop()
