"""`HOST:PORT` listen addresses as written in config files, checked before a daemon binds them.

A port past 65535 passes a digits-only check and then fails deep inside the bind with
OverflowError; a bare IPv6 address (`::1`) splits at its last colon into host `:` and port
`1`. Both are refused here, where the message can still name the key; `split` then gives the
host as a socket takes it (`[::1]` without its brackets).
"""

from __future__ import annotations

import ipaddress

MAX_PORT = 65535


def is_listen_hostport(value: str) -> bool:
    """True for `HOST:PORT` (empty host: every interface; port 0: any free one) or `[V6]:PORT`."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > MAX_PORT:
        return False
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    return ":" not in host and "[" not in host and "]" not in host and not any(c.isspace() for c in host)


def split(value: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` or `[V6]:PORT` as bind and connect take them: an IPv6 host without its
    brackets, an empty host as given (every interface). ValueError when the port is not a number."""
    host, _, port = value.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)
