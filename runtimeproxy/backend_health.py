"""Whether the runtime can be reached, found out without waiting for kubelet: the admin socket's CRI health.

The admin socket reports `runtime.v1.RuntimeService` and `ImageService` as
SERVING while containerd can be dialled and NOT_SERVING while it cannot
(docs/runtime-proxy.md). Kubelet's connections tell the relay as they go (a
dial that worked or failed, a runtime connection lost), but before kubelet
first connects, or while it has no connection open, nothing would dial. So
`BackendHealth` dials by itself: once at start, and while the runtime stays
unreachable again after a wait that doubles from `first_wait_s` up to
`max_wait_s`, until one dial works. While the runtime is up, the relay's
events are the news: a failed dial says down at once (and starts the watch
again); a lost runtime connection only starts the watch, since one closed
connection does not mean the runtime is gone. That watch goes on dialling,
with the same doubling waits, until the wait reaches `max_wait_s` with every
dial working (about 8 s with the defaults), and a relay dial that works does not
end it: a runtime that is shutting down closes its connections first and may
still accept dials for a while before it stops listening, and a watch that
ended on such a dial would leave the health at SERVING until kubelet dialled
again.

It runs on the proxy's event loop and never blocks it: a dial is one
non-blocking connect, bounded by the caller's `probe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

#: Raises OSError (TimeoutError included) when the runtime cannot be dialled; returns once it was.
Probe = Callable[[], Awaitable[None]]


class BackendHealth:
    """The runtime's reachability, reported through `report(reachable)` each time it changes."""

    def __init__(
        self, *, probe: Probe, report: Callable[[bool], None], backend_name: str,
        first_wait_s: float = 0.25, max_wait_s: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not 0 < first_wait_s <= max_wait_s:
            raise ValueError(f"first_wait_s={first_wait_s}, max_wait_s={max_wait_s}: need 0 < first <= max")
        self._probe = probe
        self._report = report
        self._backend_name = backend_name
        self._first_wait_s = first_wait_s
        self._max_wait_s = max_wait_s
        self._sleep = sleep
        #: None until the first dial's outcome is known
        self.reachable: bool | None = None
        self._watch: asyncio.Task[None] | None = None
        self._watch_confirms = False
        self._closed = False

    @property
    def watching(self) -> bool:
        return self._watch is not None and not self._watch.done()

    def start(self) -> None:
        """Dials at once, in a task of the running loop (the proxy's start does not wait for it)."""
        self._ensure_watching()

    def dialled(self, ok: bool) -> None:
        """A relay dial's outcome (after its own retries)."""
        if ok:
            if not self._confirming:
                self._stop_watching()
            self._set(True, "")
        else:
            self._set(False, "a kubelet connection could not dial it")
            self._ensure_watching()

    def lost(self) -> None:
        """The runtime closed a connection the relay had open: dial for a while to see whether it is still there."""
        if self._confirming:
            return  # already watching a loss through
        self._stop_watching()
        self._ensure_watching(confirm=True)

    async def close(self) -> None:
        self._closed = True
        task, self._watch = self._watch, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def _confirming(self) -> bool:
        return self.watching and self._watch_confirms

    def _ensure_watching(self, *, confirm: bool = False) -> None:
        if not self._closed and not self.watching:
            self._watch_confirms = confirm
            self._watch = asyncio.get_running_loop().create_task(self._watch_until_reachable(confirm))

    def _stop_watching(self) -> None:
        task, self._watch = self._watch, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _watch_until_reachable(self, confirm: bool) -> None:
        """Dials until one works (with `confirm`: until they have worked up to a wait of `max_wait_s`);
        reports down at every one that fails."""
        wait = self._first_wait_s
        while True:
            try:
                await self._probe()
            except OSError as exc:  # asyncio.TimeoutError is TimeoutError, an OSError
                confirm = False  # it was gone: the next dial that works is news enough
                self._set(False, str(exc) or type(exc).__name__)
            else:
                self._set(True, "")
                if not confirm or wait >= self._max_wait_s:
                    return
            await self._sleep(wait)
            wait = min(wait * 2, self._max_wait_s)

    def _set(self, reachable: bool, why: str) -> None:
        if reachable == self.reachable:
            return
        self.reachable = reachable
        if reachable:
            log.info("runtime reachable backend=%s", self._backend_name)
        else:
            log.warning("runtime unreachable backend=%s error=%r; dialling again every %.2g s at most",
                        self._backend_name, why, self._max_wait_s)
        self._report(reachable)
