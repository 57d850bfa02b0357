"""What the agent currently knows about its node, shared by its threads.

Discovery, health, external holders and the latest usage are written by the
NVML worker and read by the hook and the reporters; `devices()` gives the
combined picture (discovery with health overlaid and holders attached).
Listeners are told when that picture changes, so reporters write at once
instead of waiting for their resync.

Each usage sample the worker writes gets the next sequence number (`UsageSample.seq`): a reader
that polls more often than the worker samples (reclaim) tells a new sample from the one it read
before, and does not take one sample held for a while as lasting pressure.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace

from agent.discovery import Discovery
from agent.health import HealthTracker, Transition
from agent.metrics import AgentMetrics
from agent.usage import GPUUsage
from apis.devices import ExternalHolder, GPUInfo, NodeDevices

log = logging.getLogger(__name__)

#: The failed check a GPU that vanished from discovery gets at every poll while it stays away.
LOST_REASON = "lost: not found by NVML"


class UsageSample(tuple[GPUUsage, ...]):
    """One usage sample of the node's GPUs, numbered: `seq` grows by one with each sample written.

    A tuple, so readers that only want the GPUs' usage take it as one; 0 is the empty start value.
    """

    _seq: int

    def __new__(cls, gpus: Iterable[GPUUsage] = (), *, seq: int = 0) -> UsageSample:
        sample = super().__new__(cls, gpus)
        sample._seq = seq
        return sample

    @property
    def seq(self) -> int:
        return self._seq


class NodeState:
    def __init__(
        self, *, node_name: str, health: HealthTracker, metrics: AgentMetrics,
        health_changed: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        """`health_changed`: told the unhealthy GPUs (UUID: reason) after every health transition, lock held."""
        self.node_name = node_name
        self._health_changed = health_changed
        self._lock = threading.RLock()
        self._health = health
        self._metrics = metrics
        self._discovery: Discovery | None = None
        self._error = "NVML not initialised yet"
        self._holders: tuple[ExternalHolder, ...] = ()
        self._usage = UsageSample()
        #: GPUs seen once and gone at a later discovery; reported unhealthy rather than silently dropped.
        self._vanished: dict[str, GPUInfo] = {}
        #: The facts of every GPU reported since start, by UUID (the last discovery's and the vanished).
        #: Unlike `_discovery` it outlives a discovery error, so a GPU lost before a driver reload is
        #: still missed after it, and discovery can report a GPU that stops answering with its facts.
        self._known: dict[str, GPUInfo] = {}
        self._devices = NodeDevices(node_name=node_name, discovery_error=self._error)
        self._listeners: list[Callable[[NodeDevices], None]] = []
        self._ready = False

    def on_change(self, listener: Callable[[NodeDevices], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def devices(self) -> NodeDevices:
        with self._lock:
            return self._devices

    def ready(self) -> bool:
        """True once NVML has been tried: before that, a report would advertise zero GPUs for nothing."""
        with self._lock:
            return self._ready

    def discovery(self) -> Discovery | None:
        with self._lock:
            return self._discovery

    def usage(self) -> UsageSample:
        """The latest usage sample (its `seq` tells it from the one read before)."""
        with self._lock:
            return self._usage

    def known_gpus(self) -> dict[str, GPUInfo]:
        """The last known facts of every GPU reported since start, by UUID (for `discover`'s `known`)."""
        with self._lock:
            return dict(self._known)

    def vanished(self) -> tuple[str, ...]:
        """UUIDs of GPUs seen before that the last discovery did not find."""
        with self._lock:
            return tuple(self._vanished)

    def set_discovery(self, discovery: Discovery) -> None:
        with self._lock:
            found = {g.uuid for g in discovery.devices.gpus}
            for g in self._known.values():
                if g.uuid not in found and g.uuid not in self._vanished:
                    log.warning("GPU %s (index %d) no longer answers NVML; reporting it unhealthy", g.uuid, g.index)
                    self._vanished[g.uuid] = replace(g, healthy=False, health_reason=LOST_REASON)
            for g in discovery.devices.gpus:
                self._vanished.pop(g.uuid, None)
            self._known = {**self._vanished, **{g.uuid: g for g in discovery.devices.gpus}}
            self._discovery = discovery
            self._error = ""
            self._ready = True
            # Vanished GPUs keep their health history: when one comes back it must pass the quiet period.
            self._health.forget([*(g.uuid for g in discovery.devices.gpus), *self._vanished])
            self._refresh()

    def set_discovery_error(self, error: str) -> None:
        """NVML stopped answering: no GPUs are reported, and no usage (it would be the last cycle's).

        The known GPUs and their health stay, for the discovery after NVML answers again.
        """
        with self._lock:
            self._discovery = None
            self._usage = UsageSample(seq=self._usage.seq + 1)  # a sample of no GPUs: no data
            self._metrics.observe_usage(())
            self._error = error
            self._ready = True
            self._refresh()

    def set_holders(self, holders: tuple[ExternalHolder, ...]) -> None:
        with self._lock:
            if holders != self._holders:
                self._holders = holders
                self._refresh()

    def set_usage(self, usage: tuple[GPUUsage, ...]) -> None:
        with self._lock:
            self._usage = UsageSample(usage, seq=self._usage.seq + 1)

    def record_xid(self, uuid: str, xid: int, *, now: float) -> None:
        self._metrics.xid_events.labels(uuid, str(xid)).inc()
        with self._lock:
            if self._health.is_application_xid(xid):
                log.info("GPU %s: application Xid %d, health unchanged", uuid, xid)
                return
            self._apply([self._health.on_xid(uuid, xid, now=now)])

    def record_checks(self, results: Iterable[tuple[str, str]], *, now: float) -> None:
        """Periodic check results as (uuid, error); an empty error is a pass."""
        with self._lock:
            self._apply([self._health.on_check(uuid, ok=not err, now=now, reason=err) for uuid, err in results])

    def _apply(self, transitions: Iterable[Transition | None]) -> None:
        """Logs, counts and publishes health transitions (lock held)."""
        changed = False
        for t in transitions:
            if t is None:
                continue
            changed = True
            to = "healthy" if t.healthy else "unhealthy"
            log.warning("GPU %s is now %s: %s", t.uuid, to, t.reason)
            self._metrics.health_transitions.labels(t.uuid, to, t.reason.split(":")[0]).inc()
        if changed:
            if self._health_changed is not None:
                self._health_changed(self._health.unhealthy())
            self._refresh()

    def _refresh(self) -> None:
        if self._discovery is None:
            devices = NodeDevices(node_name=self.node_name, discovery_error=self._error, external_holders=self._holders)
        else:
            found = self._discovery.devices
            gpus = []
            for g in found.gpus:
                state = self._health.state(g.uuid)
                gpus.append(g if state.healthy else replace(g, healthy=False, health_reason=state.reason))
            minors = {g.minor for g in found.gpus}
            for g in self._vanished.values():
                if g.minor in minors:
                    continue  # its /dev/nvidiaN is another GPU's now; two GPUs on one minor would mislead pods
                state = self._health.state(g.uuid)
                gpus.append(g if state.healthy else replace(g, health_reason=state.reason))
            gpus.sort(key=lambda g: g.index)
            devices = replace(found, gpus=tuple(gpus), external_holders=self._holders)
        if devices == self._devices:
            return
        self._devices = devices
        self._metrics.observe_devices(devices)
        for listener in list(self._listeners):
            try:
                listener(devices)
            except Exception:
                log.exception("device change listener failed")
