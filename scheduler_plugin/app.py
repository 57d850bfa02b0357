"""Wiring: one running fgpu-scheduler, built from a `SchedulerConfig`.

Start order matters: the state is loaded from the backend before any server
accepts a request, so no decision is ever made on a partial picture. With
standalone mode and leader election, every instance keeps its state and its
pending queue current; only the leader pops the queue, and on becoming
leader it first rebuilds its state from a fresh listing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from apis import tls
from apis.keyfiles import KeyWatcher, SchedulerKeyFiles
from apis.translation import RulesWatcher, TranslationRules
from scheduler_plugin import binder
from scheduler_plugin.backend import Backend
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.backend_kubernetes import KubernetesBackend
from scheduler_plugin.config import SchedulerConfig, StateBackend
from scheduler_plugin.core.api import Clock, Core
from scheduler_plugin.events import EventRecorder
from scheduler_plugin.extender import ExtenderServer
from scheduler_plugin.grpc_service import GrpcServer
from scheduler_plugin.kube import Kube
from scheduler_plugin.leader import LeaderElector
from scheduler_plugin.metrics import Metrics
from scheduler_plugin.probes import ProbeServer
from scheduler_plugin.scheduling import SchedulingService
from scheduler_plugin.standalone import PendingQueue, StandaloneLoop

log = logging.getLogger(__name__)

CoreFactory = Callable[[], Core]


def default_core_factory(config: SchedulerConfig, *, clock: Clock = time.monotonic) -> CoreFactory:
    from scheduler_plugin.core.scheduler import Scheduler

    def build() -> Core:
        # gpuPolicyParams without gpuPolicy: a second instance of the node-level policy, tuned apart.
        gpu_policy = config.gpu_policy or (config.policy if config.gpu_policy_params else None)
        return Scheduler(
            policy=config.policy,
            gpu_policy=gpu_policy,
            policy_params=dict(config.policy_params),
            gpu_policy_params=dict(config.gpu_policy_params) or None,
            assume_ttl_s=config.assume_ttl_s,
            clock=clock,
        )

    return build


@dataclass(frozen=True)
class Timing:
    """Periods of the background loops (tests shorten them)."""

    watch_timeout_s: int = 60
    tick_s: float = 1.0
    #: allocation gauges are rebuilt from every node's view: not every tick
    gauges_every_ticks: int = 10
    standalone_idle_s: float = 0.2


class SchedulerApp:
    def __init__(
        self,
        config: SchedulerConfig,
        *,
        core_factory: CoreFactory | None = None,
        identity: str | None = None,
        clock: Clock = time.monotonic,
        timing: Timing = Timing(),
    ) -> None:
        self.config = config
        self.identity = identity or f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self._clock = clock
        self._timing = timing
        self._core_factory = core_factory or default_core_factory(config, clock=clock)
        self.kube: Kube | None = None
        self.backend: Backend | None = None
        self.service: SchedulingService | None = None
        self.grpc: GrpcServer | None = None
        self.extender: ExtenderServer | None = None
        self.probes: ProbeServer | None = None
        self.elector: LeaderElector | None = None
        self.loop: StandaloneLoop | None = None
        self.queue: PendingQueue | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._key_watcher: KeyWatcher | None = None
        self._fresh = True

    def is_leader(self) -> bool:
        if self.elector is None:
            return True
        return self.elector.is_leader()

    def start(self) -> None:
        config = self.config
        # Read now (a bad key stops the start), then again on change: a key rotation restarts nothing.
        keys = SchedulerKeyFiles(
            config.signing_key, verifying_path=config.verifying_keys, legacy_path=config.legacy_signing_key
        )
        # Read on a clock too, not only per bind: an idle scheduler takes (and logs) a rotated key as it lands.
        self._key_watcher = KeyWatcher(keys.look, name="signing-keys")
        self._key_watcher.start()
        rules = self._rules_source()
        if config.state is StateBackend.EMBEDDED:
            backend: Backend = EmbeddedBackend(path=config.db)
        else:
            self.kube = Kube.connect(kubeconfig=config.kubeconfig)
            backend = KubernetesBackend(self.kube, watch_timeout_s=self._timing.watch_timeout_s)
        self.backend = backend
        metrics = Metrics()
        recorder = EventRecorder(sink=backend.post_event, clock=self._clock, instance=self.identity)
        # Election whenever instances share a cluster: in extender mode too, two
        # replicas reserving independently could hand out one GPU twice.
        elect = config.leader_election.enabled and self.kube is not None
        service = SchedulingService(
            core_factory=self._core_factory,
            backend=backend,
            signing_key=keys,
            rules=rules,
            metrics=metrics,
            recorder=recorder,
            is_leader=self.is_leader,
        )
        self.service = service
        if config.standalone:
            self.queue = PendingQueue(clock=self._clock)
            service.pending = self.queue
        backend.start(service)  # blocks until the state is loaded

        # With the API as the record, callers name pods and the API describes them, and a node's
        # GPUs come only from its Device object; without it (embedded), callers are the record.
        from_api = config.state is StateBackend.KUBERNETES
        if config.grpc_listen:
            self.grpc = GrpcServer(
                service,
                address=config.grpc_listen,
                pods_from_api=from_api,
                accept_reports=not from_api,
                tls_files=config.grpc_tls,
            )
            self.grpc.start()
        if config.extender_listen:
            self.extender = ExtenderServer(
                service, address=config.extender_listen, pods_from_api=from_api, tls_files=config.extender_tls
            )
            self.extender.start()
        if config.metrics_listen:
            host, port = tls.split_hostport(config.metrics_listen, field="--metrics-listen", example="0.0.0.0:9445")
            self.probes = ProbeServer(service, host=host, port=port)
            self.probes.start()
        if elect and self.kube is not None:
            le = config.leader_election
            self.elector = LeaderElector(
                kube=self.kube,
                namespace=le.namespace,
                name=le.lease_name,
                identity=self.identity,
                lease_duration_s=le.lease_duration_s,
                renew_deadline_s=le.renew_deadline_s,
                retry_period_s=le.retry_period_s,
                on_started_leading=self._on_started_leading,
                on_stopped_leading=lambda: metrics.leader.set(0),
                clock=self._clock,
            )
            self.elector.start()  # the first attempt runs now: a lone instance leads on return
            # Only that first attempt may skip the resync (the state was loaded a moment ago); a standby
            # that takes over later, its first takeover included, rebuilds from a fresh listing.
            self._fresh = False
        else:
            metrics.leader.set(1)
        if config.standalone and self.queue is not None:
            self.loop = StandaloneLoop(
                service=service, queue=self.queue, is_leader=self.is_leader, idle_wait_s=self._timing.standalone_idle_s,
                recorder=recorder,
            )
            self.loop.start()
        self._ticker = threading.Thread(target=self._tick_loop, name="fgpu-scheduler-tick", daemon=True)
        self._ticker.start()
        log.info("fgpu-scheduler %s started (state=%s, standalone=%s)", self.identity, config.state.value, config.standalone)

    def interrupt_start(self) -> None:
        """Makes a `start()` that is still waiting for the API give up (SIGTERM during start)."""
        # Only events are set here: this runs in a signal handler, where taking a lock could deadlock.
        self._stop.set()
        if isinstance(self.backend, KubernetesBackend):
            self.backend.interrupt()

    def stop(self, grace: float | None = 5.0, *, release_lease: bool = True) -> None:
        """Stops everything; `release_lease=False` leaves the lease to expire (what a crash looks like).

        The lease goes last: the standalone loop and the servers stop taking work and finish the binds
        they began while this instance still holds (and renews) the lease; handed back earlier, a
        standby could take over and give out GPUs that one of those binds then takes too. A bind takes
        at most `binder.BIND_TIMEOUT_S`, so each drain waits at least that long.
        """
        self._stop.set()
        drain = None if grace is None else max(grace, binder.BIND_TIMEOUT_S + 1.0)
        if self.loop is not None:
            self.loop.stop(grace=binder.BIND_TIMEOUT_S + 1.0 if drain is None else drain)
        if self.extender is not None:
            self.extender.stop(drain)
        if self.grpc is not None:
            self.grpc.stop(drain)
        if self.elector is not None:
            self.elector.stop(release=release_lease)
        if self.probes is not None:
            self.probes.stop(grace)
        if self.backend is not None:
            self.backend.stop()
        if self._ticker is not None:
            self._ticker.join(grace)
        if self._key_watcher is not None:
            self._key_watcher.stop(5.0 if grace is None else grace)
        if self.kube is not None:
            self.kube.close()

    def _on_started_leading(self) -> None:
        assert self.service is not None and self.backend is not None
        self.service.metrics.leader.set(1)
        if self._fresh:
            self._fresh = False  # the state was loaded a moment ago, in start()
            return
        # Whatever the informers missed, a new leader decides on a fresh listing.
        self.service.resync(self.backend)

    def _rules_source(self) -> Callable[[], TranslationRules | None]:
        if not self.config.translation_rules:
            return lambda: None
        watcher = RulesWatcher(self.config.translation_rules)
        return watcher.current

    def _tick_loop(self) -> None:
        ticks = 0
        while not self._stop.wait(self._timing.tick_s):
            if self.service is None:
                continue
            try:
                self.service.tick(refresh_gauges=ticks % self._timing.gauges_every_ticks == 0)
            except Exception:
                log.exception("housekeeping tick failed")
            ticks += 1
