"""Fault injection: failed calls, hung calls, a paused server.

Faults are consumed in the order they were queued; each matches requests whose
target (path and query) contains its `path_contains`, so a test can fail only
`watch=true` calls, or only writes to `/status`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class _Pending:
    remaining: int
    status: int
    timeout: bool
    path_contains: str


@dataclass(frozen=True)
class Fault:
    """What to do to one request: answer `status`, or (timeout) never answer."""

    status: int
    timeout: bool


class Faults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._running = threading.Event()
        self._running.set()

    def fail_next(self, n: int, *, status: int, timeout: bool, path_contains: str) -> None:
        if n < 1:
            raise ValueError(f"fail_next(n={n}): n is the number of calls to fail, at least 1")
        if not timeout and not 400 <= status <= 599:
            raise ValueError(f"fail_next(status={status}): use an HTTP error code such as 500 or 503")
        with self._lock:
            self._pending.append(_Pending(n, status, timeout, path_contains))

    def take(self, target: str) -> Fault | None:
        """The fault for this request, if one is queued for it (consuming it)."""
        with self._lock:
            for pending in self._pending:
                if pending.path_contains in target:
                    pending.remaining -= 1
                    if pending.remaining == 0:
                        self._pending.remove(pending)
                    return Fault(pending.status, pending.timeout)
        return None

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def wait_running(self, ended: threading.Event, *, poll_s: float = 0.05) -> bool:
        """Block while paused; False when the server run ended meanwhile."""
        while not self._running.wait(poll_s):
            if ended.is_set():
                return False
        return not ended.is_set()
