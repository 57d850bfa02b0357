"""The threads that talk to NVML: the poll loop (init, discovery, usage and checks) and the Xid watcher.

NVML missing or failing is a state, not a crash: the poll loop logs a clear
line, publishes a report with no GPUs and the reason, and retries nvmlInit
with backoff until the driver answers. When discovery fails at the library
level later (driver unloaded), it shuts NVML down and starts over the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent import nvmlapi
from agent.cgroups import PidResolver
from agent.checkpoint import CheckpointReader, external_holders
from agent.discovery import Discovery, discover
from agent.metrics import AgentMetrics
from agent.nodestate import LOST_REASON, NodeState
from agent.nvmlapi import NVML
from agent.pcitopology import PciTopologySource
from agent.usage import UsageSampler, targets_from

log = logging.getLogger(__name__)

#: How long one nvmlEventSetWait blocks; bounds how fast the watcher notices a stop.
XID_WAIT_MS = 500


def handle_key(handle: Any) -> Any:
    """A hashable identity for an NVML handle: the device address for pynvml's ctypes pointers."""
    if hasattr(handle, "contents"):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


class XidWatcher:
    """Waits for Xid critical-error events on every GPU and feeds them to the node state."""

    def __init__(self, nvml: NVML, *, state: NodeState, handles: Mapping[str, Any], clock: Callable[[], float]) -> None:
        self._nvml = nvml
        self._state = state
        self._by_handle = {handle_key(h): uuid for uuid, h in handles.items()}
        self._handles = dict(handles)
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(grace)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvmlapi.NVMLError as err:
            log.warning("Xid events unavailable (%s); health relies on periodic checks", nvmlapi.error_text(err))
            return
        registered = 0
        for uuid, handle in self._handles.items():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvmlapi.XID_CRITICAL_ERROR_EVENT, event_set)
                registered += 1
            except nvmlapi.NVMLError as err:
                log.info("GPU %s: no Xid events (%s); periodic checks still run", uuid, nvmlapi.error_text(err))
        try:
            while registered and not self._stop.is_set():
                try:
                    event = nvml.nvmlEventSetWait_v2(event_set, XID_WAIT_MS)
                except nvmlapi.NVMLError_Timeout:
                    continue
                except nvmlapi.NVMLError as err:
                    log.warning("Xid wait failed (%s); the poll loop will restart the watcher", nvmlapi.error_text(err))
                    return
                if not int(event.eventType) & nvmlapi.XID_CRITICAL_ERROR_EVENT:
                    continue
                target = self._by_handle.get(handle_key(event.device))
                if target is None:
                    log.warning("Xid %d on an unknown device", int(event.eventData))
                    continue
                log.warning("GPU %s: Xid %d", target, int(event.eventData))
                self._state.record_xid(target, int(event.eventData), now=self._clock())
        finally:
            with contextlib.suppress(nvmlapi.NVMLError):
                nvml.nvmlEventSetFree(event_set)


class NVMLWorker:
    """The poll loop: keeps NVML initialised, rediscovers, samples usage and checks health."""

    def __init__(
        self,
        nvml: NVML,
        *,
        state: NodeState,
        topology: PciTopologySource,
        resolver: PidResolver,
        checkpoint: CheckpointReader,
        external_resources: tuple[str, ...],
        metrics: AgentMetrics,
        poll_interval_s: float = 1.0,
        discovery_interval_s: float = 60.0,
        retry_max_s: float = 60.0,
        watch_xids: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._watch_xids = watch_xids
        self._state = state
        self._topology = topology
        self._sampler = UsageSampler(nvml, resolver=resolver)
        self._checkpoint = checkpoint
        self._external = external_resources
        self._metrics = metrics
        self._poll = poll_interval_s
        self._rediscover = discovery_interval_s
        self._retry_max = retry_max_s
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        #: Set by rediscover(); cleared when a discovery starts, so one asked for during it runs again.
        self._asked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-poll", daemon=True)
        self._initialised = False
        self._last_error = ""
        self._retry_s = 1.0
        #: Wait after a cycle that raised: the poll interval, doubling to retry_max_s while it keeps raising.
        self._error_wait = poll_interval_s
        self._next_discovery = 0.0
        self._watcher: XidWatcher | None = None
        self._watched: frozenset[str] = frozenset()
        #: Completed poll iterations; tests wait on it.
        self.cycles = 0

    def start(self) -> None:
        self._thread.start()

    def rediscover(self) -> None:
        """Discover again now, not at the next discovery interval: the node's MIG instances changed,
        and the scheduler must see them in the next report."""
        self._asked.set()
        self._wake.set()

    def stop(self, grace: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(grace)
        self._stop_watcher()
        if self._initialised:
            with contextlib.suppress(nvmlapi.NVMLError):
                self._nvml.nvmlShutdown()
            self._initialised = False

    def run_once(self) -> None:
        """One iteration, without threads: init if needed, discover, sample. For --once and tests."""
        self._iterate()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self._iterate()
            except Exception:  # the thread must outlive any bug or odd failure, else health and devices freeze
                # Not NVML's way of failing (those are handled inside): a bug, a bad checkpoint
                # parse, a failing sysfs read. Log it, count it, back off and poll again.
                log.exception("NVML poll cycle failed; retrying with backoff (the agent keeps running)")
                self._metrics.poll_errors.inc()
                wait = self._error_wait
                self._error_wait = min(max(self._retry_max, self._poll), self._error_wait * 2)
            else:
                self._error_wait = self._poll
            self.cycles += 1
            self._wake.wait(wait)
            self._wake.clear()

    def _iterate(self) -> float:
        if not self._initialised and not self._init():
            return self._backoff()
        now = self._clock()
        if now >= self._next_discovery or self._asked.is_set():
            self._asked.clear()
            if not self._discover():
                return self._backoff()
            self._retry_s = 1.0
            self._next_discovery = now + self._rediscover
        discovery = self._state.discovery()
        if discovery is not None:
            self._sample(discovery)
        self._state.set_holders(
            external_holders(self._checkpoint.entries(), devices=self._state.devices(), resource_names=self._external)
        )
        return self._poll

    def _init(self) -> bool:
        try:
            self._nvml.nvmlInit()
        except nvmlapi.NVMLError as err:
            self._fail(f"NVML init failed: {nvmlapi.error_text(err)}; is the NVIDIA driver installed and "
                       "/dev/nvidia* and libnvidia-ml.so.1 visible to the agent?")
            return False
        self._initialised = True
        log.info("NVML initialised")
        return True

    def _discover(self) -> bool:
        try:
            discovery = discover(
                self._nvml, node_name=self._state.node_name, topology=self._topology, known=self._state.known_gpus()
            )
        except nvmlapi.NVMLError as err:
            self._fail(f"NVML discovery failed: {nvmlapi.error_text(err)}")
            self._stop_watcher()
            with contextlib.suppress(nvmlapi.NVMLError):
                self._nvml.nvmlShutdown()
            self._initialised = False
            return False
        if self._last_error:
            log.info("NVML answers again: %d GPU(s)", len(discovery.devices.gpus))
            self._last_error = ""
        self._state.set_discovery(discovery)
        uuids = frozenset(g.uuid for g in discovery.devices.gpus)
        if self._watch_xids and (self._watcher is None or uuids != self._watched or not self._watcher.alive()):
            self._stop_watcher()
            physical = {u: h for u, h in discovery.handles.items() if u in uuids}
            self._watcher = XidWatcher(self._nvml, state=self._state, handles=physical, clock=self._clock)
            self._watched = uuids
            self._watcher.start()
        return True

    def _sample(self, discovery: Discovery) -> None:
        started = time.process_time()
        usage = self._sampler.sample(targets_from(discovery.handles, gpus=discovery.devices.gpus))
        self._metrics.usage_cycle_cpu.observe(time.process_time() - started)
        # A GPU discovery could not read fails its check at every poll until a discovery reads it,
        # and so does one that vanished: either serves the quiet period from when it is back.
        unread = {g.uuid: g.health_reason for g in discovery.devices.gpus if not g.healthy}
        physical = {g.uuid for g in discovery.devices.gpus}
        checks = [(u.uuid, f"lost: {u.error}" if u.error else unread.get(u.uuid, "")) for u in usage if u.uuid in physical]
        sampled = {uuid for uuid, _ in checks}
        checks += [(uuid, reason) for uuid, reason in unread.items() if uuid not in sampled]
        checks += [(uuid, LOST_REASON) for uuid in self._state.vanished()]
        self._state.record_checks(checks, now=self._clock())
        self._state.set_usage(usage)
        self._metrics.observe_usage(usage)

    def _backoff(self) -> float:
        wait = self._retry_s
        self._retry_s = min(self._retry_max, self._retry_s * 2)
        return wait

    def _fail(self, message: str) -> None:
        if message != self._last_error:
            log.error("%s; retrying with backoff (the agent keeps running)", message)
        self._last_error = message
        self._state.set_discovery_error(message)
        # A GPU lost before NVML went away is still missed: its quiet period counts from its return.
        self._state.record_checks(((uuid, LOST_REASON) for uuid in self._state.vanished()), now=self._clock())

    def _stop_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
            self._watched = frozenset()
