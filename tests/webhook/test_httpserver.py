"""webhook/httpserver.py on its own: plain HTTP, a failing handler, start and stop."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from webhook.httpserver import AsyncHTTPServer, Limits


def handler(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
    if path == "/boom":
        raise RuntimeError("the handler failed")
    return 200, "text/plain", f"{method} {path} {len(body)}".encode()


@pytest.fixture
def server() -> Iterator[AsyncHTTPServer]:
    served = AsyncHTTPServer(handler, host="127.0.0.1", port=0, name="test-http",
                             limits=Limits(request_timeout_s=1.0, idle_timeout_s=1.0, max_body_bytes=1024))
    served.start()
    yield served
    served.stop(1.0)


def exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(data)
        out = b""
        while chunk := conn.recv(65536):
            out += chunk
        return out


def test_a_handler_that_raises_is_a_500_and_the_server_carries_on(server: AsyncHTTPServer) -> None:
    answer = exchange(server.port, b"GET /boom HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500 ") and b"see test-http's log" in answer
    assert exchange(server.port, b"GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n").endswith(b"GET /ok 0")


def test_plain_http_serves_keep_alive_and_http_1_0(server: AsyncHTTPServer) -> None:
    two = b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcPOST /b HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    answer = exchange(server.port, two)
    assert answer.count(b"HTTP/1.1 200 OK") == 2 and answer.endswith(b"POST /b 0")
    assert b"Connection: close" in exchange(server.port, b"GET /old HTTP/1.0\r\n\r\n")


def test_a_refusal_over_plain_http_half_closes_so_the_client_reads_it(server: AsyncHTTPServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        conn.sendall(b"POST /a HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + b"x" * 100_000)
        answer = conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 ")


def test_stop_without_start_and_twice_is_harmless() -> None:
    unstarted = AsyncHTTPServer(handler, host="127.0.0.1", port=0, name="never")
    unstarted.stop(1.0)
    unstarted.stop(1.0)
    started = AsyncHTTPServer(handler, host="127.0.0.1", port=0, name="twice")
    started.start()
    started.stop(1.0)
    started.stop(1.0)


def test_a_port_in_use_says_so() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken, pytest.raises(OSError, match="is the port in use"):
        AsyncHTTPServer(handler, host="127.0.0.1", port=taken.getsockname()[1], name="clash")


def test_stop_returns_promptly_with_idle_and_half_open_clients(server: AsyncHTTPServer) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(20)]
    half = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    half.sendall(b"POST /a HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
    stopper = threading.Thread(target=server.stop, args=(0.5,))
    stopper.start()
    stopper.join(5)
    assert not stopper.is_alive()
    for conn in [*idle, half]:
        conn.settimeout(2)
        with contextlib.suppress(ConnectionResetError):
            assert conn.recv(100) == b""  # closed by the server, not left hanging
        conn.close()
