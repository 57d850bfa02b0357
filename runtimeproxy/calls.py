"""What the relay asks of whoever decides about a call: the seam between framing and hooks.

The relay knows HTTP/2 and gRPC framing; a `CallHandler` knows the CRI. For
each new stream the relay asks `classify` how to treat it, hands intercepted
request messages to `edit`, and reports every finished call to `finished`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class StreamKind(enum.Enum):
    """How the relay treats one call."""

    #: Frames are forwarded as they come; nothing is decoded but the headers.
    PASS = enum.auto()
    #: Frames are forwarded as they come, and the request message is kept for `finished`.
    OBSERVE = enum.auto()
    #: The request message is held back, handed to `edit`, and forwarded as `edit` says.
    EDIT = enum.auto()


@dataclass(frozen=True)
class Forward:
    """Forward the request: the original bytes when `message` is None, else `message`."""

    message: bytes | None = None


@dataclass(frozen=True)
class Refuse:
    """Answer the call with this gRPC status instead of forwarding it."""

    code: int
    message: str


class CallHandler(Protocol):
    def classify(self, path: bytes) -> StreamKind: ...

    async def edit(self, path: bytes, message: bytes) -> Forward | Refuse: ...

    def finished(self, path: bytes, kind: StreamKind, message: bytes | None, code: int, seconds: float) -> None:
        """Called once per call when its status is known (`message` for OBSERVE/EDIT calls)."""
        ...
