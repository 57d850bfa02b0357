"""The proxy's exceptions, and the gRPC status each maps to when it ends a CRI call."""

from __future__ import annotations

import grpc


class ProxyError(Exception):
    """Base of the proxy's own errors."""


class ConfigError(ProxyError, ValueError):
    """A config file or flag the proxy cannot use; the message names the field, the value and the fix."""


class HookCallError(ProxyError):
    """A hook server did not answer (down, timed out, failed)."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"hook server {server!r}: {reason}")
        self.server = server
        self.reason = reason


class RuntimeLookupError(ProxyError):
    """The runtime could not tell the proxy about a container or sandbox it asked for.

    `not_found`: the runtime answered, and has no such object (the call itself will fail the same
    way there); otherwise the runtime could not be asked (down, slow, an error).
    """

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


def grpc_code(status: grpc.StatusCode) -> int:
    """The wire number of a status code (grpc.StatusCode values are (number, name) pairs)."""
    value = status.value[0]
    assert isinstance(value, int)
    return value
