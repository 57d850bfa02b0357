"""Clients that misbehave get a 4xx, a 503 or a closed connection within their limit, never a stuck server.

Raw TLS sockets, so each test controls every byte and every pause; after each,
the server still answers a real review.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable

import pytest

from tests.webhook.client import ca_context
from tests.webhook.conftest import Served
from tests.webhook.pki import SERVICE_DNS
from tests.webhook.reviews import pod, review
from webhook.httpserver import Limits

#: One-second timeouts, so a test waits a second, not the product's ten.
QUICK = Limits(request_timeout_s=1.0, idle_timeout_s=1.0, write_timeout_s=1.0, max_connections=16,
               max_body_bytes=64 * 1024, max_buffered_bytes=100 * 1024)


@pytest.fixture
def quick(start_webhook: Callable[..., Served]) -> Served:
    return start_webhook(limits=QUICK)


def connect(served: Served, *, timeout: float = 5.0) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", served.port), timeout=timeout)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return ca_context(served.ca.pem).wrap_socket(raw, server_hostname=SERVICE_DNS)


def read_answer(conn: socket.socket) -> bytes:
    """One response (head and body), or what came before the server closed."""
    data = b""
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            length = 0
            for line in data[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(data) >= end + 4 + length:
                return data
        try:
            chunk = conn.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            return data
        if not chunk:
            return data
        data += chunk


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def closed(conn: socket.socket, *, within: float) -> bool:
    conn.settimeout(within)
    try:
        while conn.recv(65536):
            pass
    except TimeoutError:
        return False
    except (ConnectionResetError, ssl.SSLError, OSError):
        return True
    return True


def post(path: str, body: bytes, *, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {SERVICE_DNS}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def still_serves(served: Served) -> None:
    client = served.client()
    try:
        assert client.post("/mutate", review(pod()))["response"]["allowed"] is True
    finally:
        client.close()


REVIEW = json.dumps(review(pod())).encode()


@pytest.mark.parametrize(
    ("request_bytes", "status", "fragment"),
    [
        pytest.param(b"GARBAGE\r\n\r\n", 400, b"malformed request line", id="not-http"),
        pytest.param(b"POST /mutate HTTP/2.0\r\n\r\n", 505, b"only HTTP/1.1", id="http2-preface-ish"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400, b"not a number", id="negative-length"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400,
                     b"two different Content-Length", id="two-lengths"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411,
                     b"Content-Length", id="chunked"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413, b"over the limit", id="huge-body"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431, b"head over", id="huge-head"),
        pytest.param(b"POST /mutate HTTP/1.1\r\nbad header\r\n\r\n", 400, b"malformed header", id="bad-header"),
    ],
)
def test_a_request_the_server_cannot_serve_gets_a_4xx_and_a_close(
    quick: Served, request_bytes: bytes, status: int, fragment: bytes
) -> None:
    with connect(quick) as conn:
        conn.sendall(request_bytes)
        answer = read_answer(conn)
        assert status_of(answer) == status, answer[:200]
        assert fragment in answer and b"Connection: close" in answer
        assert closed(conn, within=3.0)
    still_serves(quick)


def test_a_huge_body_is_refused_before_it_is_read_and_the_client_reads_the_413(quick: Served) -> None:
    body = b"x" * (5 * 1024 * 1024)
    with connect(quick) as conn:
        conn.sendall(f"POST /mutate HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        with contextlib.suppress(OSError):
            conn.sendall(body[:256 * 1024])  # the server discards a little of it while it lingers
        assert status_of(read_answer(conn)) == 413
    still_serves(quick)


def test_a_request_that_stops_halfway_gets_408_within_the_request_timeout(quick: Served) -> None:
    with connect(quick) as conn:
        conn.sendall(post("/mutate", REVIEW)[:-100])
        started = time.monotonic()
        answer = read_answer(conn)
        assert status_of(answer) == 408 and b"within 1s" in answer
        assert time.monotonic() - started < 3.0
    still_serves(quick)


def test_a_head_sent_a_byte_at_a_time_is_cut_off_at_the_request_timeout(quick: Served) -> None:
    with connect(quick) as conn:
        started = time.monotonic()
        status = 0
        for byte in post("/mutate", REVIEW):
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.05)
            if time.monotonic() - started > 1.5:
                status = status_of(read_answer(conn))
                break
        assert status == 408
    still_serves(quick)


def test_a_connection_that_never_starts_tls_is_closed(quick: Served) -> None:
    with socket.create_connection(("127.0.0.1", quick.port), timeout=5) as raw:
        assert closed(raw, within=3.0)


def test_plain_http_to_the_tls_port_is_closed_without_harm(quick: Served) -> None:
    with socket.create_connection(("127.0.0.1", quick.port), timeout=5) as raw:
        raw.sendall(post("/mutate", REVIEW))
        assert closed(raw, within=3.0)
    still_serves(quick)


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(quick: Served) -> None:
    with connect(quick) as conn:
        conn.sendall(post("/mutate", REVIEW))
        assert status_of(read_answer(conn)) == 200
        assert closed(conn, within=3.0)


def test_pipelined_requests_are_answered_in_order(quick: Served) -> None:
    first, second = review(pod()), review(pod())
    with connect(quick) as conn:
        conn.sendall(post("/mutate", json.dumps(first).encode()) + post("/validate", json.dumps(second).encode()))
        answers = [read_answer(conn)]
        rest = answers[0][answers[0].find(b"\r\n\r\n") + 4:]
        body_length = int(answers[0].split(b"Content-Length: ")[1].split(b"\r\n")[0])
        leftover = rest[body_length:]
        answers.append(leftover + read_answer(conn) if leftover else read_answer(conn))
        uids = [json.loads(a[a.find(b"\r\n\r\n") + 4:])["response"]["uid"] for a in answers]
        assert uids == [first["request"]["uid"], second["request"]["uid"]]


def test_expect_100_continue_gets_a_continue_then_the_answer(quick: Served) -> None:
    with connect(quick) as conn:
        head, body = post("/mutate", REVIEW, extra="Expect: 100-continue\r\n").split(b"\r\n\r\n", 1)
        conn.sendall(head + b"\r\n\r\n")
        assert conn.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        conn.sendall(body)
        assert status_of(read_answer(conn)) == 200


def test_more_connections_than_the_limit_close_the_longest_waiting(quick: Served) -> None:
    conns = [connect(quick) for _ in range(QUICK.max_connections)]
    try:
        newest = connect(quick)  # the first one, idle longest, makes room
        newest.sendall(post("/mutate", REVIEW))
        assert status_of(read_answer(newest)) == 200
        assert closed(conns[0], within=2.0)
        newest.close()
    finally:
        for conn in conns:
            conn.close()
    still_serves(quick)


def test_bodies_being_read_share_one_budget_past_which_the_answer_is_503(quick: Served) -> None:
    size = 60 * 1024  # two fit the 100 KiB budget only one at a time
    with connect(quick) as first, connect(quick) as second:
        first.sendall(f"POST /mutate HTTP/1.1\r\nContent-Length: {size}\r\n\r\n".encode() + b"x" * 100)
        time.sleep(0.2)
        second.sendall(f"POST /mutate HTTP/1.1\r\nContent-Length: {size}\r\n\r\n".encode())
        answer = read_answer(second)
        assert status_of(answer) == 503 and b"busy" in answer
    still_serves(quick)


def test_a_client_that_does_not_read_its_answers_is_cut_off_after_the_write_timeout(quick: Served) -> None:
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    raw.settimeout(5)
    raw.connect(("127.0.0.1", quick.port))
    conn = ca_context(quick.ca.pem).wrap_socket(raw, server_hostname=SERVICE_DNS)
    conn.settimeout(0.5)
    sent = 0
    # A 404 repeats the path, so each answer is as big as its request and the server's socket buffer fills.
    request = f"GET /{'x' * 8000} HTTP/1.1\r\nHost: {SERVICE_DNS}\r\n\r\n".encode()
    with contextlib.suppress(OSError):  # a timeout: the server stopped reading, as it should
        for _ in range(5000):  # pipelined, never read: the answers pile up until the server stops reading
            conn.sendall(request)
            sent += 1
    assert 10 < sent < 5000
    still_serves(quick)  # meanwhile, others are served
    time.sleep(QUICK.write_timeout_s + 0.5)
    assert closed(conn, within=2.0)
    conn.close()


def test_stop_lets_a_request_being_read_finish_within_the_grace(start_webhook: Callable[..., Served]) -> None:
    served = start_webhook()
    conn = connect(served)
    request = post("/mutate", REVIEW)
    conn.sendall(request[:-10])
    time.sleep(0.1)
    stopper = threading.Thread(target=served.app.stop, args=(3.0,))
    stopper.start()
    time.sleep(0.3)
    conn.sendall(request[-10:])
    answer = read_answer(conn)
    stopper.join(10)
    assert status_of(answer) == 200 and b"Connection: close" in answer
    conn.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", served.port), timeout=1).close()


def test_many_clients_at_once_over_the_connection_limit_all_end_promptly(quick: Served) -> None:
    results: list[int] = []
    lock = threading.Lock()

    def hit() -> None:
        try:
            with connect(quick, timeout=5) as conn:
                conn.sendall(post("/mutate", REVIEW))
                status = status_of(read_answer(conn))
        except OSError:
            status = -1  # closed to make room: the API server would retry or apply its failurePolicy
        with lock:
            results.append(status)

    threads = [threading.Thread(target=hit) for _ in range(64)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert len(results) == 64 and time.monotonic() - started < 15
    assert results.count(200) >= QUICK.max_connections // 2
    assert set(results) <= {200, 0, -1}
    still_serves(quick)
