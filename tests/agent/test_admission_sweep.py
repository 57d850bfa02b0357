"""Admission-ledger entries of pods whose PostStopPodSandbox was missed, released by listing the node's pods."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from agent.admissions import AdmissionLedger, Hold
from agent.admissionsweep import AdmissionSweeper, SweepReason
from agent.config import AgentConfig, parse_config
from agent.daemon import Agent
from agent.errors import ConfigError, KubeAPIError
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.kube import Kube
from agent.metrics import AgentMetrics
from agent.pcitopology import InventoryTopology
from agent.podsources import KubePods
from tests.agent.helpers import T4
from tests.kubeapi import KubeAPIServer
from tests.waiting import wait_until as _wait

NODE = "gpu-node-1"
GRACE = 120.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pod(uid: str, *, phase: str = "Running", node: str = NODE, name: str = "") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name or f"pod-{uid}", "namespace": "team-a", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": phase},
    }


def _seed(cluster: KubeAPIServer, *pods: dict[str, object]) -> None:
    for pod in pods:
        cluster.put_object("/api/v1/namespaces/team-a/pods", pod)


@pytest.fixture
def kube(kube_api: KubeAPIServer) -> Iterator[Kube]:
    client = Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=2.0)
    yield client
    client.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(clock: Clock) -> AdmissionLedger:
    return AdmissionLedger(clock=clock)


@pytest.fixture
def metrics() -> AgentMetrics:
    return AgentMetrics()


@pytest.fixture
def sweeper(kube: Kube, ledger: AdmissionLedger, metrics: AgentMetrics, clock: Clock) -> AdmissionSweeper:
    return AdmissionSweeper(
        KubePods(kube, node_name=NODE), ledger=ledger, metrics=metrics, grace_s=GRACE, clock=clock
    )


def _admit(ledger: AdmissionLedger, uid: str) -> None:
    ledger.record(pod_uid=uid, holds=[Hold(gpu_uuid="GPU-0", core_percent=50)])


def _swept(metrics: AgentMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("fgpu_agent_admissions_swept_total", {"reason": reason}) or 0.0


def test_the_entry_of_a_pod_that_is_gone_is_released_and_counted(
    kube_api: KubeAPIServer, sweeper: AdmissionSweeper, ledger: AdmissionLedger, metrics: AgentMetrics, clock: Clock
) -> None:
    _seed(kube_api, _pod("alive"))
    _admit(ledger, "alive")
    _admit(ledger, "gone")
    clock.now += GRACE + 1
    assert sweeper.sweep() == {"gone": SweepReason.GONE}
    assert set(ledger.pods()) == {"alive"}
    assert ledger.held()["GPU-0"].core_percent == 50
    assert _swept(metrics, "gone") == 1
    assert metrics.admitted_pods._value.get() == 1


def test_the_entry_of_a_running_pod_stays_and_that_of_a_finished_pod_is_released(
    kube_api: KubeAPIServer, sweeper: AdmissionSweeper, ledger: AdmissionLedger, metrics: AgentMetrics, clock: Clock
) -> None:
    _seed(kube_api, _pod("running"), _pod("done", phase="Succeeded"), _pod("crashed", phase="Failed"))
    for uid in ("running", "done", "crashed"):
        _admit(ledger, uid)
    clock.now += GRACE + 1
    assert sweeper.sweep() == {"done": SweepReason.FINISHED, "crashed": SweepReason.FINISHED}
    assert set(ledger.pods()) == {"running"}
    assert _swept(metrics, "finished") == 2
    assert sweeper.sweep() == {}


def test_a_pod_with_the_same_uid_on_another_node_does_not_keep_the_entry(
    kube_api: KubeAPIServer, sweeper: AdmissionSweeper, ledger: AdmissionLedger, clock: Clock
) -> None:
    _seed(kube_api, _pod("moved", node="gpu-node-2"))
    _admit(ledger, "moved")
    clock.now += GRACE + 1
    assert sweeper.sweep() == {"moved": SweepReason.GONE}
    assert ledger.pods() == {}


def test_a_fresh_entry_stays_during_the_grace_window_even_when_the_api_does_not_list_its_pod(
    sweeper: AdmissionSweeper, ledger: AdmissionLedger, metrics: AgentMetrics, clock: Clock
) -> None:
    _admit(ledger, "just-admitted")
    clock.now += GRACE - 1
    assert sweeper.sweep() == {}
    assert set(ledger.pods()) == {"just-admitted"}
    clock.now += 2
    assert sweeper.sweep() == {"just-admitted": SweepReason.GONE}
    assert _swept(metrics, "gone") == 1


def test_an_entry_recorded_again_restarts_its_grace_window(
    sweeper: AdmissionSweeper, ledger: AdmissionLedger, clock: Clock
) -> None:
    _admit(ledger, "restarting")
    clock.now += GRACE + 1
    _admit(ledger, "restarting")
    assert sweeper.sweep() == {}
    assert set(ledger.pods()) == {"restarting"}


def test_an_api_error_leaves_the_ledger_untouched(
    kube_api: KubeAPIServer, sweeper: AdmissionSweeper, ledger: AdmissionLedger, metrics: AgentMetrics, clock: Clock
) -> None:
    _admit(ledger, "gone")
    clock.now += GRACE + 1
    kube_api.fail_next(1, status=500, path_contains="pods")
    with pytest.raises(KubeAPIError, match="500"):
        sweeper.sweep()
    assert set(ledger.pods()) == {"gone"}
    assert _swept(metrics, "gone") == 0
    assert sweeper.sweep() == {"gone": SweepReason.GONE}


def test_the_sweep_period_and_grace_are_configurable_and_checked() -> None:
    config = parse_config({"admissionSweep": "15s", "admissionSweepGrace": "5m"})
    assert (config.admission_sweep_s, config.admission_sweep_grace_s) == (15.0, 300.0)
    assert (AgentConfig().admission_sweep_s, AgentConfig().admission_sweep_grace_s) == (60.0, 120.0)
    with pytest.raises(ConfigError, match="admissionSweep=0: must be more than zero"):
        parse_config({"admissionSweep": 0})
    with pytest.raises(ConfigError, match="admissionSweepGrace"):
        parse_config({"admissionSweepGrace": -1})



def test_the_running_agent_sweeps_its_ledger_on_its_own_with_kubernetes(kube_api: KubeAPIServer) -> None:
    _seed(kube_api, _pod("alive"))
    # Short: a unix socket path must fit in 108 bytes.
    tmp = tempfile.mkdtemp(prefix="fgpu-sweep-")
    config = AgentConfig(
        node_name=NODE,
        report_to_kubernetes=True,
        hook_listen=f"unix://{tmp}/hooks.sock",
        verifying_keys=os.path.join(tmp, "no-key"),
        metrics_listen="",
        admission_sweep_s=0.05,
        admission_sweep_grace_s=0.0,
        checkpoint_path=os.path.join(tmp, "no-checkpoint"),
        proc_root=os.path.join(tmp, "proc"),
    )
    inventory = load_inventory(T4)
    agent = Agent(
        config,
        node_name=NODE,
        nvml=FakeNVML(inventory),
        topology=InventoryTopology(inventory),
        kube=Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=1.0),
    )
    _admit(agent.ledger, "alive")
    _admit(agent.ledger, "gone")
    agent.start()
    try:
        _wait(lambda: set(agent.ledger.pods()) == {"alive"})
    finally:
        agent.stop(2)
        shutil.rmtree(tmp, ignore_errors=True)
