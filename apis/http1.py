"""HTTP/1.1 on the wire, for fgpu's small HTTP servers: reading a request head, writing a response.

Pure functions over bytes, so every server (threads or asyncio, plain or TLS)
applies the same rules to what a client sends:

- the request line is `METHOD TARGET HTTP/1.1` (or 1.0), else 400 (505 for
  another version); header lines are `token: value`, else 400;
- a body comes with a Content-Length of plain digits (else 400), at most
  `max_body_bytes` (else 413, before any of it is read); two different
  lengths are refused (request smuggling), and so is Transfer-Encoding (411):
  Kubernetes' clients always send a length;
- the connection stays open unless the client says `Connection: close`
  (HTTP/1.1) or does not say `keep-alive` (HTTP/1.0).

Example head (what `parse_head` reads, without the blank line that ends it)::

    POST /mutate?timeout=5s HTTP/1.1\\r\\nHost: fgpu-webhook.fgpu-system.svc:443\\r\\n
    Content-Type: application/json\\r\\nContent-Length: 3345

The limits on time and on connections are the server's, not this module's.
"""

from __future__ import annotations

import http
import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

_REASONS = {s.value: s.phrase for s in http.HTTPStatus}

#: Where a request head ends.
HEAD_END = b"\r\n\r\n"

_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Header lines, each `token: value` (no control characters but tab in the value) and its CRLF.
_HEADER_LINE = re.compile(r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):([^\x00-\x08\x0a-\x1f\x7f]*)\r\n")
_HEADER_BLOCK = re.compile(r"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*\r\n)*")


class HeadError(Exception):
    """A request that cannot be served: answer `status` with the message, then close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RequestHead(NamedTuple):
    """One request's head. Immutable; a NamedTuple rather than a frozen dataclass, since one is built
    per request and it builds several times faster."""

    method: str
    #: The request target as sent, query included ("/mutate?timeout=5s").
    target: str
    version: str
    #: Header names in lower case; a repeated header keeps its last value.
    headers: Mapping[str, str]
    content_length: int
    keep_alive: bool

    @property
    def path(self) -> str:
        """The target without its query: what a server routes on."""
        return self.target.partition("?")[0]

    @property
    def expects_continue(self) -> bool:
        return self.headers.get("expect", "").lower() == "100-continue"


def parse_head(head: bytes, *, max_body_bytes: int) -> RequestHead:
    """The request head (the bytes before HEAD_END); raises HeadError when it cannot be served."""
    text = head.decode("latin-1")
    request_line, _, rest = text.partition("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1]:
        raise HeadError(400, f"malformed request line {request_line[:80]!r}; send e.g. 'POST /validate HTTP/1.1'")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HeadError(505, f"{version[:20]!r}: only HTTP/1.1 and HTTP/1.0 are served")
    block = rest + "\r\n" if rest else ""
    if not _HEADER_BLOCK.fullmatch(block):  # one pass checks every line; the loop below finds the bad one
        for line in rest.split("\r\n"):
            if not _HEADER_BLOCK.fullmatch(line + "\r\n"):
                raise HeadError(400, f"malformed header line {line[:80]!r}; send 'Name: value'")
    headers: dict[str, str] = {}
    for name, value in _HEADER_LINE.findall(block):
        key = name.lower()
        value = value.strip()
        if key == "content-length" and key in headers and headers[key] != value:
            raise HeadError(400, "two different Content-Length headers; send one")
        headers[key] = value
    if "transfer-encoding" in headers:
        raise HeadError(411, "Transfer-Encoding is not accepted; send the body with a Content-Length")
    raw_length = headers.get("content-length", "0")
    if not _CONTENT_LENGTH.fullmatch(raw_length):
        raise HeadError(400, f"Content-Length: {raw_length[:40]!r} is not a number of bytes; send e.g. Content-Length: 1234")
    length = int(raw_length)
    if length > max_body_bytes:
        raise HeadError(413, f"Content-Length: {length} is over the limit of {max_body_bytes} bytes")
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return RequestHead(method=method, target=target, version=version, headers=headers, content_length=length,
                       keep_alive=keep_alive)


def response(
    status: int, content_type: str, body: bytes, *, keep_alive: bool, headers: Iterable[tuple[str, str]] = ()
) -> bytes:
    """A whole HTTP/1.1 response: status line, headers, body."""
    reason = _REASONS.get(status, "Status")
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{extra}"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("latin-1") + body


#: Sent before the body when a client asks `Expect: 100-continue`.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
