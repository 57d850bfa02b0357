"""The extender's HTTP server against clients that misbehave, over raw sockets.

Every bad client gets a 4xx (or 503, or a closed connection) within its
limit, never a thread that waits forever, and the server still answers a good
request afterwards (often: meanwhile).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from apis.httpserver import BoundedHTTPServer, Limits
from scheduler_plugin.extender import LIMITS, MAX_BODY_BYTES, ExtenderServer
from scheduler_plugin.probes import PROBE_LIMITS, ProbeServer
from scheduler_plugin.scheduling import SchedulingService

FIXTURES = Path(__file__).parent / "fixtures"

#: Short timeouts so a test waits a second, not the product's ten.
QUICK = replace(LIMITS, request_timeout_s=1.0, idle_timeout_s=1.0, write_timeout_s=1.0)


def serve(service: SchedulingService, limits: Limits = LIMITS) -> ExtenderServer:
    server = ExtenderServer(service, address="127.0.0.1:0", pods_from_api=False, limits=limits)
    server.start()
    return server


@pytest.fixture
def port(embedded_service: Callable[[], SchedulingService]) -> Iterator[int]:
    """The extender with the product's limits."""
    server = serve(embedded_service())
    yield server.port
    server.stop(1.0)


@pytest.fixture
def quick_port(embedded_service: Callable[[], SchedulingService]) -> Iterator[int]:
    """The extender with the product's limits but one-second timeouts."""
    server = serve(embedded_service(), QUICK)
    yield server.port
    server.stop(1.0)


def connect(port: int, *, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_answer(conn: socket.socket) -> bytes:
    """One response (head and Content-Length body), or what came before the server closed."""
    data = b""
    while True:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            length = 0
            for line in data[:head_end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(data) >= head_end + 4 + length:
                return data
        try:
            chunk = conn.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), f"no HTTP answer: {answer[:80]!r}"
    return int(answer.split(b" ", 2)[1])


def closed_by_server(conn: socket.socket) -> bool:
    """True when the server has closed: what is left to read ends (an answer first, perhaps)."""
    try:
        while conn.recv(65536):
            pass
    except ConnectionResetError:
        return True
    return True


def ask(port: int, raw: bytes) -> bytes:
    with connect(port) as conn:
        conn.sendall(raw)
        return read_answer(conn)


def assert_answers_a_good_request(port: int, *, within_s: float = 2.0) -> None:
    started = time.monotonic()
    answer = ask(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status(answer) == 200 and answer.endswith(b"ok")
    assert time.monotonic() - started < within_s


def post_head(length: str, path: str = "/fgpu/filter") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()


# --- Content-Length ------------------------------------------------------------------------------


def test_a_negative_content_length_gets_400_at_once(port: int) -> None:
    answer = ask(port, post_head("-1"))

    assert status(answer) == 400 and b"Content-Length" in answer
    assert_answers_a_good_request(port)


@pytest.mark.parametrize("value", ["abc", "1e3", "+5", "0x10", "12 3", "99999999999999999999"])
def test_a_content_length_that_is_not_a_plain_number_gets_400_naming_the_header(port: int, value: str) -> None:
    answer = ask(port, post_head(value))

    assert status(answer) == 400 and b"Content-Length" in answer
    assert_answers_a_good_request(port)


@pytest.mark.parametrize("length", [MAX_BODY_BYTES + 1, 64 * 1024 * 1024, 10**15])
def test_a_content_length_over_the_limit_gets_413_before_any_body_is_sent(port: int, length: int) -> None:
    started = time.monotonic()

    answer = ask(port, post_head(str(length)))

    assert status(answer) == 413 and str(MAX_BODY_BYTES).encode() in answer
    assert time.monotonic() - started < 2.0  # not read: the body never comes
    assert_answers_a_good_request(port)


def test_an_oversized_body_sent_anyway_gets_413_or_a_closed_connection(port: int) -> None:
    with connect(port) as conn:
        conn.sendall(post_head(str(MAX_BODY_BYTES + 1024 * 1024)))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it stopped reading: also an answer
            conn.sendall(b"x" * (MAX_BODY_BYTES + 1024 * 1024))
        answer = read_answer(conn)
    assert answer == b"" or status(answer) == 413
    assert_answers_a_good_request(port)


def test_a_chunked_body_gets_411(port: int) -> None:
    answer = ask(port, b"POST /fgpu/filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")

    assert status(answer) == 411
    assert_answers_a_good_request(port)


def test_a_request_head_over_the_limit_gets_431(port: int) -> None:
    answer = ask(port, b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * LIMITS.max_header_bytes + b"\r\n\r\n")

    assert status(answer) == 431
    assert_answers_a_good_request(port)


def test_a_malformed_request_line_gets_400(port: int) -> None:
    assert status(ask(port, b"NOT A REQUEST LINE AT ALL\r\n\r\n")) == 400
    assert status(ask(port, b"GET /healthz HTTP/9.9\r\n\r\n")) == 505


def test_filter_args_for_5000_nodes_with_the_longest_names_fit_the_body_limit(port: int) -> None:
    # Kubernetes' largest cluster, every node name at the DNS limit of 253 characters.
    names = [f"{i:05d}-" + "n" * 247 for i in range(5000)]
    pod = json.loads((FIXTURES / "filter-nodecachecapable.json").read_text())["Pod"]
    body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
    assert len(body) < MAX_BODY_BYTES

    with connect(port, timeout=30) as conn:
        conn.sendall(post_head(str(len(body))) + body)
        answer = read_answer(conn)

    assert status(answer) == 200
    result = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert len(result["FailedAndUnresolvableNodes"]) == 5000


# --- slow clients -----------------------------------------------------------------------------


def test_headers_sent_a_byte_at_a_time_get_408_and_a_close_within_the_request_timeout(quick_port: int) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    started = time.monotonic()
    answer = b""
    with connect(quick_port) as conn:
        conn.settimeout(0.2)
        for byte in request:  # slowloris: never idle long, never done
            try:
                conn.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                answer += conn.recv(65536)
                break  # the server spoke (or closed): the slow request is over
            except TimeoutError:
                continue
        conn.settimeout(5)
        answer += read_answer(conn)
    elapsed = time.monotonic() - started

    assert status(answer) == 408
    assert elapsed < QUICK.request_timeout_s + 1.5


def test_a_body_sent_slowly_gets_408(quick_port: int) -> None:
    with connect(quick_port) as conn:
        conn.sendall(post_head("100") + b"{")
        started = time.monotonic()
        answer = read_answer(conn)

    assert status(answer) == 408
    assert time.monotonic() - started < QUICK.request_timeout_s + 1.5


def test_a_connection_that_sends_nothing_is_closed_after_the_request_timeout(quick_port: int) -> None:
    with connect(quick_port) as conn:
        started = time.monotonic()
        assert closed_by_server(conn)
    assert time.monotonic() - started < QUICK.request_timeout_s + 1.5


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(quick_port: int) -> None:
    with connect(quick_port) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status(read_answer(conn)) == 200
        started = time.monotonic()
        assert closed_by_server(conn)
    assert time.monotonic() - started < QUICK.idle_timeout_s + 1.5


# --- many clients ---------------------------------------------------------------------------------


def test_more_idle_connections_than_workers_do_not_delay_a_good_request(port: int) -> None:
    idle = [connect(port) for _ in range(LIMITS.workers * 4)]
    try:
        assert_answers_a_good_request(port)
    finally:
        for conn in idle:
            conn.close()


def test_connections_beyond_the_limit_close_the_longest_waiting_and_a_good_request_is_still_answered(
    embedded_service: Callable[[], SchedulingService],
) -> None:
    # Long request timeout: what closes connections here is the connection limit, not a deadline.
    limits = replace(LIMITS, max_connections=8, request_timeout_s=30.0)
    server = serve(embedded_service(), limits)
    try:
        flood = []
        for _ in range(20):
            flood.append(connect(server.port, timeout=2.0))
            time.sleep(0.01)  # accepted in order: the oldest are the ones closed
        assert_answers_a_good_request(server.port)
        for conn in flood[:10]:
            assert closed_by_server(conn)  # promptly: a timeout would raise
        for conn in flood:
            conn.close()
    finally:
        server.stop(1.0)


def test_requests_beyond_the_workers_and_the_queue_get_503_at_once_and_none_is_lost() -> None:
    release = threading.Event()

    def slow(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        release.wait(10)
        return 200, "text/plain", b"done"

    server = BoundedHTTPServer(slow, host="127.0.0.1", port=0, name="test", limits=Limits(workers=1, queue_size=1))
    server.start()
    try:
        held = [connect(server.port) for _ in range(2)]
        for conn in held:  # one at a time: the first runs, the second waits in the queue
            conn.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.2)
        started = time.monotonic()
        refused = ask(server.port, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status(refused) == 503 and time.monotonic() - started < 2.0
        release.set()
        assert [status(read_answer(conn)) for conn in held] == [200, 200]
        for conn in held:
            conn.close()
    finally:
        release.set()
        server.stop(1.0)


def test_a_client_that_never_reads_its_answer_holds_a_worker_only_for_the_write_timeout() -> None:
    def answer(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if path == "/big":
            return 200, "text/plain", b"x" * (64 * 1024 * 1024)  # more than any socket buffer holds
        return 200, "text/plain", b"ok"

    limits = Limits(workers=1, queue_size=4, write_timeout_s=0.5)
    server = BoundedHTTPServer(answer, host="127.0.0.1", port=0, name="test", limits=limits)
    server.start()
    try:
        with connect(server.port) as stuck:
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.1)
            started = time.monotonic()
            assert status(ask(server.port, b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")) == 200
            assert time.monotonic() - started < limits.write_timeout_s + 1.0
    finally:
        server.stop(1.0)


# --- the good path stays good ------------------------------------------------------------------------


def test_keep_alive_and_pipelined_requests_are_answered_in_order_on_one_connection(port: int) -> None:
    with connect(port) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = read_answer(conn)
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
        second = read_answer(conn)
        third = read_answer(conn)

    assert [status(first), status(second), status(third)] == [200, 200, 404]


def test_expect_100_continue_is_answered_before_the_body(port: int) -> None:
    body = json.dumps(json.loads((FIXTURES / "filter-nodecachecapable.json").read_text())).encode()
    with connect(port) as conn:
        conn.sendall(post_head(str(len(body)))[:-2] + b"Expect: 100-continue\r\n\r\n")
        interim = conn.recv(65536)
        conn.sendall(body)
        final = read_answer(conn)

    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert status(final) == 200


def test_stop_returns_promptly_with_idle_and_slow_clients_connected(embedded_service: Callable[[], SchedulingService]) -> None:
    server = serve(embedded_service())
    clients = [connect(server.port) for _ in range(5)]
    clients[0].sendall(b"GET /healthz HTTP/1.1\r\nHost")  # half a request

    started = time.monotonic()
    server.stop(1.0)

    assert time.monotonic() - started < 1.5
    for conn in clients:
        assert closed_by_server(conn)
        conn.close()


# --- the probe listener: liveness whatever the scrapers do ----------------------------------------


def connect_from(address: str, port: int, *, receive_buffer: int = 0) -> socket.socket:
    """A connection from another loopback address (another peer), optionally with a tiny receive buffer."""
    conn = socket.socket()
    if receive_buffer:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    conn.bind((address, 0))
    conn.settimeout(5.0)
    conn.connect(("127.0.0.1", port))
    return conn


@pytest.fixture
def probes(embedded_service: Callable[[], SchedulingService], monkeypatch: pytest.MonkeyPatch) -> Iterator[ProbeServer]:
    """The metrics listener, whose /metrics answer is more than any socket buffer holds (a big cluster)."""
    service = embedded_service()
    monkeypatch.setattr(service.metrics, "exposition", lambda: b"# a large cluster's series\n" * (1 << 20))
    server = ProbeServer(service, host="127.0.0.1", port=0)
    server.start()
    yield server
    server.stop(1.0)


def test_scrapers_that_read_slowly_hold_no_worker_and_liveness_and_metrics_still_answer_at_once(probes: ProbeServer) -> None:
    slow = []
    for _ in range(PROBE_LIMITS.workers + 2):  # more than the workers: before, each held one for the write timeout
        conn = connect_from("127.0.0.2", probes.port, receive_buffer=4096)
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        slow.append(conn)
    time.sleep(0.3)
    try:
        for path in (b"/healthz", b"/readyz"):
            started = time.monotonic()
            answer = ask(probes.port, b"GET " + path + b" HTTP/1.1\r\nHost: kubelet\r\n\r\n")
            assert (status(answer), answer.endswith(b"ok")) == (200, True)
            assert time.monotonic() - started < 1.0
        with connect_from("127.0.0.3", probes.port) as prometheus:
            started = time.monotonic()
            prometheus.sendall(b"GET /metrics HTTP/1.1\r\nHost: prometheus\r\n\r\n")
            answer = read_answer(prometheus)
            assert status(answer) == 200 and answer.endswith(b"series\n")
            assert time.monotonic() - started < 3.0
    finally:
        for conn in slow:
            conn.close()


def test_a_client_that_does_not_take_its_answer_in_time_is_disconnected_without_holding_a_worker() -> None:
    def answer(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        return 200, "text/plain", b"x" * (16 * 1024 * 1024) if path == "/big" else b"ok"

    limits = Limits(workers=1, queue_size=4, write_timeout_s=1.5)
    server = BoundedHTTPServer(answer, host="127.0.0.1", port=0, name="test", limits=limits)
    server.start()
    try:
        with connect_from("127.0.0.2", server.port, receive_buffer=4096) as stuck:
            stuck.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.1)
            started = time.monotonic()
            assert status(ask(server.port, b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")) == 200
            assert time.monotonic() - started < 1.0  # the one worker was free at once, not after the write timeout
            time.sleep(limits.write_timeout_s + 0.3)
            assert closed_by_server(stuck)
    finally:
        server.stop(1.0)


def test_one_address_holds_at_most_its_share_of_the_probe_listeners_connections(probes: ProbeServer) -> None:
    cap = PROBE_LIMITS.max_connections_per_peer
    held = [connect_from("127.0.0.2", probes.port) for _ in range(cap)]
    time.sleep(0.2)
    try:
        with connect_from("127.0.0.2", probes.port) as one_more:
            one_more.settimeout(2.0)
            assert one_more.recv(1) == b""  # closed at once, not after the request timeout
        assert status(ask(probes.port, b"GET /healthz HTTP/1.1\r\nHost: kubelet\r\n\r\n")) == 200
        held.pop().close()
        time.sleep(0.2)
        with connect_from("127.0.0.2", probes.port) as again:
            again.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status(read_answer(again)) == 200
    finally:
        for conn in held:
            conn.close()


def test_a_flood_of_pipelined_probes_is_answered_in_order_without_exhausting_the_loop(probes: ProbeServer) -> None:
    count = 3000
    with connect(probes.port, timeout=10.0) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * count)
        received = b""
        while received.count(b"HTTP/1.1 200") < count:
            chunk = conn.recv(1 << 20)
            assert chunk, f"closed after {received.count(b'HTTP/1.1 200')} answers"
            received += chunk
    assert_answers_a_good_request(probes.port)


def test_a_large_answer_over_tls_arrives_whole_to_a_client_that_reads_it_slowly(tmp_path: Path) -> None:
    from apis import tls
    from tests.scheduler_service.certs import make_pki

    pki = make_pki(tmp_path)
    body = bytes(range(256)) * (32 * 1024)  # 8 MiB: many TLS records, many partial writes

    def answer(method: str, path: str, _: bytes) -> tuple[int, str, bytes]:
        return 200, "application/octet-stream", body

    context = tls.server_ssl_context(pki.server_files(), field="extenderTLS")
    server = BoundedHTTPServer(answer, host="127.0.0.1", port=0, name="test", ssl_context=context)
    server.start()
    client = ssl.create_default_context(cafile=str(pki.ca))
    client.load_cert_chain(str(pki.client.cert), str(pki.client.key))
    try:
        with connect_from("127.0.0.2", server.port, receive_buffer=8192) as raw, client.wrap_socket(
            raw, server_hostname="localhost"
        ) as conn:
            conn.sendall(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\n")
            time.sleep(0.3)  # the server fills the buffers and waits to write
            received = read_answer(conn)  # type: ignore[arg-type]
            conn.sendall(b"GET /again HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            again = read_answer(conn)  # type: ignore[arg-type]
        assert status(received) == 200 and received.endswith(body) and len(received) < len(body) + 200
        assert status(again) == 200 and again.endswith(body)
    finally:
        server.stop(1.0)
