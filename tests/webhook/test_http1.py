"""apis/http1.py, the request-head rules every fgpu HTTP server applies (here because the webhook is its first user)."""

from __future__ import annotations

import pytest

from apis import http1

HEAD = (b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: fgpu-webhook.fgpu-system.svc:443\r\n"
        b"Content-Type: application/json\r\nContent-Length: 3345\r\nAccept-Encoding: gzip")


def test_a_head_as_the_api_server_sends_it() -> None:
    head = http1.parse_head(HEAD, max_body_bytes=4096)
    assert (head.method, head.target, head.path, head.content_length, head.keep_alive) == (
        "POST", "/mutate?timeout=10s", "/mutate", 3345, True)
    assert head.headers["content-type"] == "application/json" and not head.expects_continue


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /mutate", 400),
        (b"POST  /mutate HTTP/1.1", 400),
        (b"P(ST /mutate HTTP/1.1", 400),
        (b"POST /mutate HTTP/2", 505),
        (b"POST /m HTTP/1.1\r\nContent-Length: 12a", 400),
        (b"POST /m HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 2", 400),
        (b"POST /m HTTP/1.1\r\nTransfer-Encoding: chunked", 411),
        (b"POST /m HTTP/1.1\r\nContent-Length: 4097", 413),
        (b"POST /m HTTP/1.1\r\nContent-Length: 9999999999999999999", 400),
        (b"POST /m HTTP/1.1\r\n: no name", 400),
        (b"POST /m HTTP/1.1\r\nX: a\x00b", 400),
        (b"POST /m HTTP/1.1\r\nX: a\rb", 400),
    ],
)
def test_heads_that_cannot_be_served(head: bytes, status: int) -> None:
    with pytest.raises(http1.HeadError) as raised:
        http1.parse_head(head, max_body_bytes=4096)
    assert raised.value.status == status


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"GET / HTTP/1.1", True),
        (b"GET / HTTP/1.1\r\nConnection: close", False),
        (b"GET / HTTP/1.0", False),
        (b"GET / HTTP/1.0\r\nConnection: Keep-Alive", True),
    ],
)
def test_keep_alive(head: bytes, keep_alive: bool) -> None:
    assert http1.parse_head(head, max_body_bytes=0).keep_alive is keep_alive


def test_the_same_length_twice_is_fine_and_tabs_in_values_too() -> None:
    head = http1.parse_head(b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\nX:\ta\tb\t", max_body_bytes=10)
    assert head.content_length == 2 and head.headers["x"] == "a\tb"


def test_a_response_has_its_length_and_connection() -> None:
    assert http1.response(404, "text/plain", b"nope", keep_alive=False) == (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope")
    assert http1.response(599, "a/b", b"", keep_alive=True, headers=[("X-A", "1")]).startswith(
        b"HTTP/1.1 599 Status\r\nContent-Type: a/b\r\nContent-Length: 0\r\nX-A: 1\r\nConnection: keep-alive")
