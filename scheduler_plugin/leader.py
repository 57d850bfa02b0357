"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Only the leader binds. A candidate takes the lease when its record has not
changed for `lease_duration_s` *as observed on the candidate's own monotonic
clock* (never by comparing the leader's wall-clock renewTime with ours, so
clock skew between machines cannot cause two leaders). Writes carry the
lease's resourceVersion, so two candidates cannot both win one expiry.

The leader stops acting as leader once it has failed to renew for
`renew_deadline_s`, which is shorter than `lease_duration_s`: by the time a
standby may take over, the old leader has already stopped binding, so no GPU
is handed out by two instances.

Checking that once, when a bind begins, is not enough: a leader paused (GC,
SIGSTOP, a slow API call) between that check and its write would bind, on
its stale view, after a new leader has handed the same GPU out. So `start`
fences the Kube it was given: every pod write through it runs `check_lead`
right before the request leaves, and a deposed leader's write is refused
locally (`NotLeader`).

What is left is the time between that check and the API server applying the
write. `check_lead` answers it: the time until a standby could take the lease
(last renewal + `lease_duration_s`; a standby counts from when it *received*
that renewal, so never earlier) less `FENCE_SAFETY_GAP_S`, and the Kube sends
the write once (no client retries) with that as its whole timeout. A leader
still leads only within `renew_deadline_s` of its renewal, so every write gets
at least `lease_duration_s - renew_deadline_s - FENCE_SAFETY_GAP_S` (4.5 s as
deployed); `fencing_problem` refuses settings that leave it less than
`MIN_FENCED_WRITE_S`. The Binding itself carries the pod's uid and
resourceVersion, so it lands only on the pod the decision was made for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from scheduler_plugin.core.api import Clock
from scheduler_plugin.errors import KubeAPIError, NotLeader
from scheduler_plugin.kube import Kube

log = logging.getLogger(__name__)

JSON = dict[str, Any]

#: Taken off every fenced write's time: what passes between the lease check and the request leaving
#: (GIL, GC), the API server noticing a client that gave up, and the rates of two machines' clocks.
FENCE_SAFETY_GAP_S = 0.5
#: The least time a fenced write (a Binding) may be given; settings that leave less are refused.
MIN_FENCED_WRITE_S = 0.5


def fencing_problem(*, lease_duration_s: float, renew_deadline_s: float) -> str:
    """Why these lease settings cannot fence a write (empty when they can)."""
    margin = lease_duration_s - renew_deadline_s
    need = FENCE_SAFETY_GAP_S + MIN_FENCED_WRITE_S
    if margin > need:
        return ""
    return (
        f"leaderElection: leaseDurationSeconds - renewDeadlineSeconds = {lease_duration_s:g} - {renew_deadline_s:g} "
        f"= {margin:g}s is the time a leader's last write has before a standby may take the lease; it must be "
        f"larger than {need:g}s (a {MIN_FENCED_WRITE_S:g}s Binding plus the {FENCE_SAFETY_GAP_S:g}s safety gap), "
        "or a Binding could land after another instance leads; e.g. leaseDurationSeconds 15, renewDeadlineSeconds 10"
    )


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    lease_duration_s: int
    acquire_time: str
    renew_time: str
    transitions: int

    @classmethod
    def from_lease(cls, lease: JSON) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=str(spec.get("acquireTime") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def spec(self) -> JSON:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_s,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


def may_take(
    *, record: LeaseRecord, identity: str, observed_at: float, now: float, lease_duration_s: float
) -> bool:
    """Whether `identity` may write the lease: it holds it, nobody does, or it expired as observed locally."""
    if record.holder in ("", identity):
        return True
    duration = record.lease_duration_s or lease_duration_s
    return now - observed_at >= duration


def next_record(*, current: LeaseRecord | None, identity: str, lease_duration_s: float, wall: datetime) -> LeaseRecord:
    stamp = wall.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    duration = max(1, round(lease_duration_s))
    if current is not None and current.holder == identity:
        return LeaseRecord(identity, duration, current.acquire_time or stamp, stamp, current.transitions)
    transitions = 0 if current is None else current.transitions + (1 if current.holder else 0)
    return LeaseRecord(identity, duration, stamp, stamp, transitions)


class LeaderElector:
    def __init__(
        self,
        *,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float,
        renew_deadline_s: float,
        retry_period_s: float,
        on_started_leading: Callable[[], None] = lambda: None,
        on_stopped_leading: Callable[[], None] = lambda: None,
        clock: Clock = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        safety_gap_s: float = FENCE_SAFETY_GAP_S,
    ) -> None:
        if lease_duration_s - renew_deadline_s <= safety_gap_s:
            raise ValueError(
                f"lease_duration_s - renew_deadline_s = {lease_duration_s - renew_deadline_s:g}s leaves no time for a "
                f"fenced write after the {safety_gap_s:g}s safety gap; make the lease longer"
            )
        self._kube = kube
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._lease_duration_s = lease_duration_s
        self._renew_deadline_s = renew_deadline_s
        self._retry_period_s = retry_period_s
        self._safety_gap_s = safety_gap_s
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock = clock
        self._wall = wall
        self._observed: LeaseRecord | None = None
        self._observed_rv = ""
        self._observed_at = 0.0
        self._leading = False
        self._last_renew = float("-inf")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        """True while leading and the last renewal is within the renew deadline (a stalled loop loses it)."""
        return self._leading and self._clock() - self._last_renew < self._renew_deadline_s

    def check_lead(self) -> float:
        """The Kube's write fence: the seconds a write may take as leader, or NotLeader.

        That is until a standby could take the lease (it waits `lease_duration_s` from when it received
        our last renewal, which is after we sent it), less the safety gap.
        """
        now = self._clock()
        if not self._stop.is_set() and self.is_leader():
            return self._writes_end() - now
        raise NotLeader(
            f"fgpu-scheduler {self.identity} does not hold lease {self._namespace}/{self._name} now "
            f"(last renewed {now - self._last_renew:.1f}s ago; renew deadline {self._renew_deadline_s:.1f}s), so it "
            "writes no pod: the current leader binds; this instance retries if it leads again"
        )

    def start(self) -> None:
        """Fences the Kube's pod writes with the lease, campaigns once now (so a lone instance leads when this
        returns), then in the background."""
        self._kube.fence_pod_writes(self.check_lead)
        self.campaign()
        self._thread = threading.Thread(target=self._loop, name="fgpu-leader-election", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True, grace: float = 5.0) -> None:
        """Stops campaigning; with `release`, hands the lease back so a standby takes over at once.

        From here the fence refuses every write; the lease is handed back only once no write it
        admitted can still land (each is bounded by its timeout), so the next leader never races one.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(grace)
        if self._leading:
            self._step_down()
            if release:
                if not self._kube.wait_fenced_writes(timeout_s=self._writes_end() - self._clock()):
                    log.warning("leader election: a pod write outlived its time; releasing the lease anyway")
                self._release()

    def _writes_end(self) -> float:
        """When a write admitted now must be done; no write admitted earlier ends later (renewals only move it on)."""
        return self._last_renew + self._lease_duration_s - self._safety_gap_s

    def try_acquire_or_renew(self) -> bool:
        # `now`, from before any request, is when a renewal counts from: the lease is written after it.
        now = self._clock()
        try:
            lease = self._kube.get_lease(namespace=self._namespace, name=self._name)
            # A record is first seen when the answer arrives (client-go: observedTime after the Get); stamped
            # before the GET, a slow GET would let this standby take over that much early.
            received = self._clock()
            if lease is None:
                record = next_record(current=None, identity=self.identity, lease_duration_s=self._lease_duration_s, wall=self._wall())
                created = self._kube.create_lease(namespace=self._namespace, body=self._body(record, rv=""))
                self._observe(record, created, now)
                return True
            current = LeaseRecord.from_lease(lease)
            rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
            if current != self._observed or rv != self._observed_rv:
                self._observed, self._observed_rv, self._observed_at = current, rv, received
            if not may_take(
                record=current, identity=self.identity, observed_at=self._observed_at, now=now, lease_duration_s=self._lease_duration_s
            ):
                return False
            record = next_record(current=current, identity=self.identity, lease_duration_s=self._lease_duration_s, wall=self._wall())
            replaced = self._kube.replace_lease(namespace=self._namespace, name=self._name, body=self._body(record, rv=rv))
            self._observe(record, replaced, now)
            return True
        except KubeAPIError as exc:
            if exc.status != 409:
                log.warning("leader election: lease %s/%s: %s", self._namespace, self._name, exc)
            return False

    def _observe(self, record: LeaseRecord, lease: JSON, now: float) -> None:
        self._observed = record
        self._observed_rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        self._observed_at = now
        self._last_renew = now

    def _body(self, record: LeaseRecord, *, rv: str) -> JSON:
        metadata: JSON = {"name": self._name, "namespace": self._namespace}
        if rv:
            metadata["resourceVersion"] = rv
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": record.spec()}

    def _loop(self) -> None:
        while not self._stop.wait(self._retry_period_s):
            self.campaign()

    def campaign(self) -> None:
        """One round: acquire or renew, start or stop leading (the background loop's step; tests call it)."""
        if not self._stop.is_set():
            ok = self.try_acquire_or_renew()
            if ok and not self._leading and not self._stop.is_set():
                self._leading = True
                log.info("leader election: %s now leads (lease %s/%s)", self.identity, self._namespace, self._name)
                try:
                    self._on_started()
                except Exception:
                    log.exception("on_started_leading failed; giving up the lease")
                    self._step_down()
                    self._release()
            elif self._leading and self._clock() - self._last_renew >= self._renew_deadline_s:
                log.warning("leader election: %s could not renew for %.1fs; stepping down", self.identity, self._renew_deadline_s)
                self._step_down()

    def _step_down(self) -> None:
        if not self._leading:
            return
        self._leading = False
        try:
            self._on_stopped()
        except Exception:
            log.exception("on_stopped_leading failed")

    def _release(self) -> None:
        try:
            lease = self._kube.get_lease(namespace=self._namespace, name=self._name)
            if lease is None or LeaseRecord.from_lease(lease).holder != self.identity:
                return
            current = LeaseRecord.from_lease(lease)
            released = LeaseRecord("", 1, current.acquire_time, current.renew_time, current.transitions)
            rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
            self._kube.replace_lease(namespace=self._namespace, name=self._name, body=self._body(released, rv=rv))
        except KubeAPIError as exc:
            log.warning("leader election: could not release lease: %s", exc)
