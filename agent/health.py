"""GPU health as a state machine over observations: Xid events and periodic checks.

Pure: no NVML, no clock of its own (every call carries `now`). Unlike the
device plugins, unhealthy is not forever: once a GPU has passed checks for
`quiet_period_s` since its last failure it is healthy again. Every change of
state comes back as a `Transition` for the caller to log and count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Xids caused by the application (bad kernel, MMU fault in user code,
#: graphics engine exception the app triggered ...), not by the GPU. The
#: NVIDIA device plugin skips the same set by default.
DEFAULT_APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

#: "Fallen off the bus".
XID_FALLEN_OFF_BUS = 79


@dataclass(frozen=True)
class HealthState:
    healthy: bool = True
    reason: str = ""
    #: When the last failure was seen; recovery counts from here.
    last_failure_at: float | None = None


@dataclass(frozen=True)
class Transition:
    uuid: str
    healthy: bool
    reason: str
    at: float


class HealthTracker:
    """Health of each GPU by UUID. Not thread-safe; the owner serialises calls."""

    def __init__(self, *, quiet_period_s: float = 300.0, application_xids: Iterable[int] = DEFAULT_APPLICATION_XIDS) -> None:
        if quiet_period_s < 0:
            raise ValueError(f"health quiet period {quiet_period_s}s is negative; use 0 or more seconds")
        self._quiet = quiet_period_s
        self._ignored = frozenset(application_xids)
        self._states: dict[str, HealthState] = {}

    def state(self, uuid: str) -> HealthState:
        return self._states.get(uuid, HealthState())

    def states(self) -> dict[str, HealthState]:
        return dict(self._states)

    def is_application_xid(self, xid: int) -> bool:
        return xid in self._ignored

    def on_xid(self, uuid: str, xid: int, *, now: float) -> Transition | None:
        """An Xid critical error on `uuid`; application Xids change nothing."""
        if xid in self._ignored:
            return None
        return self._fail(uuid, f"Xid{xid}", now)

    def on_check(self, uuid: str, *, ok: bool, now: float, reason: str = "") -> Transition | None:
        """The result of a periodic check (handle lookup and a cheap query)."""
        if not ok:
            return self._fail(uuid, reason or "check failed", now)
        current = self.state(uuid)
        if current.healthy:
            return None
        assert current.last_failure_at is not None
        if now - current.last_failure_at < self._quiet:
            return None
        self._states[uuid] = HealthState()
        return Transition(uuid=uuid, healthy=True, reason=f"recovered after {self._quiet:g}s without errors", at=now)

    def restore(self, uuid: str, reason: str, *, now: float) -> None:
        """A failure recorded by an earlier agent process: unhealthy, with the quiet period starting `now`.

        No transition: the GPU was already reported unhealthy, by the agent that recorded it."""
        self._states[uuid] = HealthState(healthy=False, reason=reason, last_failure_at=now)

    def unhealthy(self) -> dict[str, str]:
        """The reason of every unhealthy GPU, by UUID."""
        return {uuid: s.reason for uuid, s in self._states.items() if not s.healthy}

    def forget(self, keep: Iterable[str]) -> None:
        """Drops the state of GPUs no longer present."""
        wanted = set(keep)
        for uuid in [u for u in self._states if u not in wanted]:
            del self._states[uuid]

    def _fail(self, uuid: str, reason: str, now: float) -> Transition | None:
        current = self.state(uuid)
        self._states[uuid] = HealthState(healthy=False, reason=reason, last_failure_at=now)
        if not current.healthy and current.reason == reason:
            return None  # still failing the same way: the quiet period restarts, nothing to announce
        return Transition(uuid=uuid, healthy=False, reason=reason, at=now)
