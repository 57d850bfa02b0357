"""The running agent: its threads and servers, wired together, with start() and stop(grace).

    NVMLWorker ──► NodeState ──► HookServer (PreCreateContainer)
    XidWatcher ─┘       │
                        ├──► ReportLoop("kubernetes") ─► KubeReporter
                        └──► ReportLoop("scheduler")  ─► SchedulerReporter
    AdmissionLedger ◄── ReportLoop("admission-sweep") ◄─ KubePods | RuntimePods (CRI) | EitherPods (API, else CRI)
                    ◄── LedgerRebuilder (at start, and with the sweep until one listing succeeds)
    MIGLifecycle ◄── HookServer (create at PreCreateContainer, destroy at PostStopPodSandbox)
                 ◄── start and the sweep (reconcile) ──► NVMLWorker.rediscover ──► reports
    ReportLoop("mig-mode") ─► MIGModeSwitch (Node requests of fgpuctl mig) ─► MIGLifecycle, NVML, Node
    ReclaimService (with `overcommit:` and Kubernetes) ◄── NodeState usage ──► pod deletions, Events
    NoReclaim (Kubernetes, no `overcommit:`) ──► the node's burstable-ratio label removed

Start order: the NVML worker, then (with a pod source) one ledger rebuild once
the first discovery is in, then the MIG reconcile (instances fgpu made that no
running pod holds go), then the hook server, so a restarted agent counts
the pods already running before it admits a new one (`agent.ledger_rebuild`).

Nothing here decides anything: the decisions live in `agent.health`,
`agent.hook`, `agent.node_report`, `agent.admissionsweep` and `agent.ledger_rebuild`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from agent.admissions import AdmissionLedger
from agent.admissionsweep import AdmissionSweeper, PodSource
from agent.backendreport import IsolationMonitor
from agent.cgroups import PidResolver
from agent.checkpoint import CheckpointReader
from agent.config import AgentConfig, health_record_path, mig_record_path
from agent.criclient import RuntimeClient
from agent.errors import KubeAPIError, RuntimeUnavailable
from agent.health import HealthTracker
from agent.health_record import HealthRecord, read_boot_id
from agent.hook import HookSettings
from agent.hookserver import GPUHookServicer, HookServer
from agent.isolation.readiness import Files
from agent.kube import Kube
from agent.ledger_rebuild import LedgerRebuilder
from agent.metrics import AgentMetrics
from agent.mig_lifecycle import MIGLifecycle, MIGReporter
from agent.mig_mode_switch import MIGModeSwitch
from agent.mig_nvml import MIGNode, OwnedFile
from agent.node_report_writer import KubeReporter
from agent.nodestate import NodeState
from agent.nvmlapi import NVML
from agent.nvmlworker import NVMLWorker
from agent.pcitopology import PciTopologySource
from agent.podsources import EitherPods, KubePods, RuntimePods
from agent.reclaim import ReclaimPolicy
from agent.reclaim_loop import ReclaimLoop, sample_max_age_s
from agent.reclaim_service import NoReclaim, ReclaimService
from agent.reclaim_settings import SettingsFile
from agent.resync_loop import ReportLoop
from agent.schedclient import SchedulerReporter
from apis import hostport
from apis.devices import NodeDevices
from apis.keyfiles import KeyWatcher, VerifyingKeyFiles
from apis.metrics_server import MetricsServer
from apis.signing import SigningKeyError

log = logging.getLogger(__name__)

#: How long start() waits for the first discovery before the hook serves without a rebuilt ledger
#: (the hook then holds admissions back itself, see `_hook_devices`).
DISCOVERY_WAIT_S = 10.0


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        node_name: str,
        nvml: NVML,
        topology: PciTopologySource,
        kube: Kube | None = None,
        scheduler: SchedulerReporter | None = None,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        discovery_wait_s: float = DISCOVERY_WAIT_S,
        isolation_files: Files | None = None,
    ) -> None:
        """`isolation_files`: where the isolation backend's files are read (`agent.backendcheck.HostFiles`
        on a node); with them the agent checks its backend, reports it (condition, Event, metric) and
        rejects shares the backend cannot enforce. None (a fake-NVML test rig): no check."""
        self.config = config
        self._discovery_wait_s = discovery_wait_s
        self.node_name = node_name
        self.metrics = metrics or AgentMetrics()
        health = HealthTracker(quiet_period_s=config.health_quiet_period_s, application_xids=config.application_xids)
        # Failures an earlier agent process saw stay failures: their Xids will not be delivered again.
        self.health_record = HealthRecord(Path(health_record_path(config)), boot_id=read_boot_id(config.proc_root))
        for uuid, reason in self.health_record.load().items():
            log.warning("GPU %s was unhealthy before the agent restarted (%s); it stays so for the quiet period", uuid, reason)
            health.restore(uuid, reason, now=clock())
        self.state = NodeState(
            node_name=node_name, health=health, metrics=self.metrics, health_changed=self.health_record.save,
        )
        self.worker = NVMLWorker(
            nvml,
            state=self.state,
            topology=topology,
            resolver=PidResolver(proc_root=config.proc_root),
            checkpoint=CheckpointReader(config.checkpoint_path),
            external_resources=config.external_resources,
            metrics=self.metrics,
            poll_interval_s=config.poll_interval_s,
            discovery_interval_s=config.discovery_interval_s,
            retry_max_s=config.nvml_retry_max_s,
            clock=clock,
        )
        # Re-read on change, so a key rotation restarts no agent; until a first good read every
        # call retries and raises SigningKeyError (the hook then rejects allocations, saying why).
        self._keys = VerifyingKeyFiles(config.verifying_keys, legacy_path=config.legacy_signing_key)
        # Read on a clock too, not only per pod: an idle node takes (and logs) a new key as it lands.
        self._key_watcher = KeyWatcher(self._keys.look, name="verifying-keys")
        self.ledger = AdmissionLedger(clock=clock)
        self.rebuilder: LedgerRebuilder | None = None
        record = OwnedFile(Path(mig_record_path(config)))
        self.mig = MIGLifecycle(
            MIGNode(nvml, record, observer=MIGReporter(self.metrics, changed=self.worker.rediscover)),
            record, ledger=self.ledger, devices=self.state.devices, ledger_complete=self._ledger_complete,
        )
        self.hook = HookServer(
            listen=config.hook_listen,
            servicer=GPUHookServicer(
                devices=self._hook_devices, settings=self._hook_settings, metrics=self.metrics, ledger=self.ledger,
                mig=self.mig,
            ),
        )
        self.loops: list[ReportLoop] = []
        self.isolation: IsolationMonitor | None = None
        if isolation_files is not None:
            self.isolation = IsolationMonitor(
                node_name=node_name, isolation=config.isolation, paths=config.isolation_paths,
                metrics=self.metrics, kube=kube, files=isolation_files, clock=clock,
            )
            self.loops.append(ReportLoop(
                target="isolation", report=self.isolation.report, resync_s=config.report_resync_s, metrics=self.metrics
            ))
        self.kube_reporter: KubeReporter | None = None
        self.mig_mode: MIGModeSwitch | None = None
        #: Not in `loops`: device changes say nothing about pods; they poke it only while the
        #: ledger rebuild still waits for GPUs.
        self.sweep_loop: ReportLoop | None = None
        self._runtime: RuntimeClient | None = None
        pods: PodSource | None = None
        rebuild_pods: PodSource | None = None
        api_pods = KubePods(kube, node_name=node_name) if kube is not None else None
        if config.runtime_endpoint:
            self._runtime = RuntimeClient(config.runtime_endpoint)
            runtime_pods = RuntimePods(self._runtime, node_name=node_name)
            if api_pods is not None:
                # The runtime backs the API up: with the API down a restarted agent still learns what
                # runs here, so GPU admissions resume (`agent.listing_choice`).
                pods = EitherPods(api_pods, runtime_pods, add_unlisted=False)
                rebuild_pods = EitherPods(api_pods, runtime_pods, add_unlisted=True)
            else:
                pods = runtime_pods
        elif api_pods is not None:
            pods = api_pods
            log.info("without runtimeEndpoint an agent restarted while the Kubernetes API is down admits no GPU "
                     "share until the API answers")
        if pods is not None:
            rebuilder = LedgerRebuilder(
                rebuild_pods or pods, ledger=self.ledger, metrics=self.metrics, node_name=node_name,
                key=self._keys.verifying_keys, devices=self.state.devices,
            )
            self.rebuilder = rebuilder
            sweeper = AdmissionSweeper(
                pods, ledger=self.ledger, metrics=self.metrics, grace_s=config.admission_sweep_grace_s, clock=clock,
                isolation_paths=lambda: config.isolation_paths,
            )

            def sweep() -> None:
                # Until one listing succeeded the rebuild rides on the sweep: a failed listing
                # raises here and the loop retries with backoff, then every sweep period.
                rebuilder.rebuild()
                sweeper.sweep()
                self._reconcile_mig()

            self.sweep_loop = ReportLoop(
                target="admission-sweep", report=sweep, resync_s=config.admission_sweep_s, metrics=self.metrics
            )
        else:
            log.warning(
                "admission ledger starts empty: with neither a Kubernetes client nor runtimeEndpoint the agent "
                "cannot list the pods already running, so after a restart it does not count their GPU shares"
            )
        if kube is not None:
            reporter = KubeReporter(kube, node_name=node_name, advertise_nvidia_gpu=config.advertise_nvidia_gpu)
            self.kube_reporter = reporter
            self.loops.append(
                ReportLoop(
                    target="kubernetes",
                    report=lambda: self._when_ready(reporter.report),
                    resync_s=config.report_resync_s,
                    metrics=self.metrics,
                )
            )
            # `fgpuctl mig enable|disable` requests on the Node (docs/mig.md, "Mode changes").
            self.mig_mode = MIGModeSwitch(
                node_name=node_name, kube=kube, nvml=nvml, mig=self.mig, ledger=self.ledger,
                devices=self.state.devices, ledger_complete=self._ledger_complete, changed=self.worker.rediscover,
            )
            switch = self.mig_mode
            self.loops.append(ReportLoop(
                target="mig-mode", report=lambda: switch.report() if self.state.ready() else None,
                resync_s=config.report_resync_s, metrics=self.metrics,
            ))
        if scheduler is not None:
            sched = scheduler
            resync = _Resync(config.report_resync_s, clock)
            self.loops.append(
                ReportLoop(
                    target="scheduler",
                    report=lambda: self._when_ready(lambda devices: _report_to_scheduler(sched, devices, self.state, resync)),
                    resync_s=config.report_resync_s,
                    metrics=self.metrics,
                )
            )
        self.reclaim: ReclaimService | None = None
        if config.overcommit and kube is None:
            log.warning("overcommit=%s is set, but reclaim evicts through Kubernetes, which this agent has no client "
                        "for: no reclaim", config.overcommit)
        elif config.overcommit and kube is not None:
            self.reclaim = ReclaimService(
                settings=SettingsFile(config.overcommit),
                loop=ReclaimLoop(
                    node_name=node_name, kube=kube, keys=self._keys.verifying_keys, devices=self.state.devices,
                    usage=self.state.usage, policy=ReclaimPolicy(), registry=self.metrics.registry, clock=clock,
                    sample_max_age_s=sample_max_age_s(config.poll_interval_s),
                ),
                node_name=node_name, isolation=config.isolation, labels=kube,
            )
        # No reclaim here: the burstable-ratio label an earlier configuration wrote must go, or the
        # scheduler keeps sending burstable pods to a node where nothing takes their memory back.
        self.no_reclaim = None if kube is None or self.reclaim is not None else NoReclaim(node_name=node_name, labels=kube)
        self._kube = kube
        self._scheduler = scheduler
        self._metrics_server: MetricsServer | None = None
        self.state.on_change(self._devices_changed)

    def start(self) -> None:
        self.worker.start()
        self._key_watcher.start()
        if self.rebuilder is not None:
            self._rebuild_ledger(self.rebuilder)
            self._reconcile_mig()
        if self.isolation is not None:
            self.isolation.refresh()  # the hook's first answer already knows the backend
        self.hook.start()
        for loop in self.loops:
            loop.start()
        if self.sweep_loop is not None:
            self.sweep_loop.start()
        if self.reclaim is not None:
            self.reclaim.start()
        if self.no_reclaim is not None:
            self.no_reclaim.start()
        if self.config.metrics_listen:
            host, port = hostport.split(self.config.metrics_listen)
            # Not prometheus_client's server: on hostNetwork every pod reaches this port, and that one
            # gives each connection a thread with no read deadline (apis/metrics_server.py).
            self._metrics_server = MetricsServer(self.metrics.registry, host=host, port=port, name="fgpu-agent-metrics")
            self._metrics_server.start()
            log.info("metrics on http://%s:%d/metrics", host or "0.0.0.0", self._metrics_server.port)
        log.info("fgpu agent started on node %s", self.node_name)

    def stop(self, grace: float = 5.0) -> None:
        log.info("fgpu agent stopping")
        self.hook.stop(grace)
        if self.reclaim is not None:
            self.reclaim.stop(grace)
        if self.no_reclaim is not None:
            self.no_reclaim.stop(grace)
        for loop in self.loops:
            loop.stop(grace)
        if self.sweep_loop is not None:
            self.sweep_loop.stop(grace)
        self.worker.stop(grace)
        self._key_watcher.stop(grace)
        if self._metrics_server is not None:
            self._metrics_server.stop(grace)
        if self._scheduler is not None:
            self._scheduler.close()
        if self._kube is not None:
            self._kube.close()
        if self._runtime is not None:
            self._runtime.close()

    @property
    def metrics_port(self) -> int:
        return self._metrics_server.port if self._metrics_server is not None else 0

    def _hook_settings(self) -> HookSettings:
        return HookSettings(
            node_name=self.node_name,
            key=self._keys.verifying_keys(),
            isolation=self.config.isolation,
            paths=self.config.isolation_paths,
            backend_problem=self.isolation.current().problem if self.isolation is not None else "",
        )

    def _ledger_complete(self) -> bool:
        """The ledger holds every running pod: rebuilt from a pod listing since this process started."""
        return self.rebuilder is not None and not self.rebuilder.pending

    def _reconcile_mig(self) -> None:
        try:
            self.mig.reconcile()
        except Exception:  # the next sweep tries again; a bug here must not stop the agent
            log.exception("MIG reconcile failed unexpectedly")

    def _rebuild_ledger(self, rebuilder: LedgerRebuilder) -> None:
        """One rebuild before the hook serves: after the first discovery, bounded by `discovery_wait_s`."""
        deadline = time.monotonic() + self._discovery_wait_s
        while not self.state.ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            rebuilder.rebuild()
        except (KubeAPIError, RuntimeUnavailable):
            pass  # logged by the rebuilder; retried with the sweep
        except Exception:
            # The agent starts whatever the rebuild does; the sweep loop tries again.
            log.exception("admission ledger rebuild failed unexpectedly; starting with an empty ledger")

    def _hook_devices(self) -> NodeDevices:
        """The devices as the hook sees them: not ready while a possible ledger rebuild has not been tried.

        Covers GPUs or the key arriving after start(): admitting then would
        ignore the pods already running. Asking wakes the sweep loop, which
        rebuilds; kubelet retries the rejected container.
        """
        devices = self.state.devices()
        rebuilder = self.rebuilder
        if rebuilder is None or not rebuilder.pending or devices.discovery_error:
            return devices
        if self.sweep_loop is not None:
            self.sweep_loop.poke()
        return replace(
            devices,
            discovery_error="the agent has not yet restored its record of the GPU shares held by the pods "
            f"already running here (it lists them {rebuilder.where}); kubelet retries",
        )

    def _when_ready(self, report: Callable[[NodeDevices], None]) -> None:
        # Until NVML has been tried once the picture is "no GPUs, not initialised"; writing it
        # would flap the node's GPU resources to zero on every agent restart.
        if self.state.ready():
            report(self.mig.mark(self.state.devices()))

    def _devices_changed(self, devices: NodeDevices) -> None:
        for loop in self.loops:
            loop.poke()
        if self.rebuilder is not None and self.rebuilder.pending and self.sweep_loop is not None:
            self.sweep_loop.poke()


class _Resync:
    """True once per period: when the scheduler gets the report even if nothing changed."""

    def __init__(self, period_s: float, clock: Callable[[], float]) -> None:
        self._period = period_s
        self._clock = clock
        self._next = 0.0

    def due(self) -> bool:
        return self._clock() >= self._next

    def done(self) -> None:
        self._next = self._clock() + self._period


def _report_to_scheduler(reporter: SchedulerReporter, devices: NodeDevices, state: NodeState, resync: _Resync) -> None:
    if reporter.report(devices, state.usage(), force=resync.due()):
        resync.done()


__all__ = ["Agent", "SigningKeyError"]
