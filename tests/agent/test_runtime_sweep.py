"""Without Kubernetes, admission-ledger entries are released by asking a real containerd (CRI ListPodSandbox)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Protocol

import grpc
import pytest

from agent.admissions import AdmissionLedger, Hold
from agent.admissionsweep import AdmissionSweeper, SweepReason
from agent.config import AgentConfig, parse_config
from agent.criclient import RuntimeClient
from agent.daemon import Agent
from agent.discovery import discover
from agent.errors import ConfigError, RuntimeUnavailable
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.main import build_parser, load_settings
from agent.metrics import AgentMetrics
from agent.pcitopology import InventoryTopology
from agent.podsources import RuntimePods
from apis.allocation import Allocation, ContainerShare, GPUShare
from apis.devices import NodeDevices
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from apis.signing import allocation_annotations
from tests.agent.helpers import T4, started_fake
from tests.containerd.fixtures import containerd  # noqa: F401 - a fixture
from tests.containerd.harness import Containerd
from tests.runtimeproxy.kubelet import Kubelet, Pod, PodSpec
from tests.signing_keys import signing_key, write_verifying_keys
from tests.waiting import wait_until as _wait

NODE = "gpu-node-1"
GRACE = 120.0


def _t4_devices() -> NodeDevices:
    nvml, inventory = started_fake(T4)
    return discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices


T4_DEVICES = _t4_devices()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def kubelet(containerd: Containerd) -> Iterator[Kubelet]:  # noqa: F811 - the fixture above
    with Kubelet(containerd.address) as k:
        yield k


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
def runtime(containerd: Containerd) -> Iterator[RuntimeClient]:  # noqa: F811
    client = RuntimeClient(containerd.address, request_timeout_s=5.0)
    yield client
    client.close()


@pytest.fixture
def sweeper(runtime: RuntimeClient, ledger: AdmissionLedger, metrics: AgentMetrics, clock: Clock) -> AdmissionSweeper:
    return AdmissionSweeper(
        RuntimePods(runtime, node_name=NODE), ledger=ledger, metrics=metrics, grace_s=GRACE, clock=clock
    )


class RunPod(Protocol):
    def __call__(self, name: str, *, annotations: Callable[[str], dict[str, str]] | None = None) -> Pod: ...


@pytest.fixture
def pods(kubelet: Kubelet) -> Iterator[RunPod]:
    """Runs host-network sandboxes, annotated with `annotations(pod uid)`; removes what is left of them after the test."""
    started: list[Pod] = []

    def run(name: str, *, annotations: Callable[[str], dict[str, str]] | None = None) -> Pod:
        spec = PodSpec(name=name, namespace="team-a")
        if annotations is not None:
            spec.annotations = annotations(spec.uid)
        pod = kubelet.run_pod(spec)
        started.append(pod)
        return pod

    yield run
    for pod in started:
        with contextlib.suppress(grpc.RpcError):  # removed by the test already
            kubelet.teardown(pod)


def _admit(ledger: AdmissionLedger, uid: str) -> None:
    ledger.record(pod_uid=uid, holds=[Hold(gpu_uuid="GPU-0", core_percent=25)])


def _swept(metrics: AgentMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("fgpu_agent_admissions_swept_total", {"reason": reason}) or 0.0


def test_the_runtime_lists_sandboxes_with_the_pod_uid_and_their_state(
    kubelet: Kubelet, runtime: RuntimeClient, pods: RunPod
) -> None:
    pod = pods("listed")
    listed = {s.id: s for s in runtime.list_pod_sandboxes()}
    assert listed[pod.sandbox_id].pod_uid == pod.spec.uid
    assert listed[pod.sandbox_id].ready
    kubelet.stop_pod(pod)
    assert not {s.id: s for s in runtime.list_pod_sandboxes()}[pod.sandbox_id].ready


def test_entries_of_stopped_and_removed_sandboxes_are_released_after_the_grace_and_a_ready_one_stays(
    kubelet: Kubelet, sweeper: AdmissionSweeper, ledger: AdmissionLedger, metrics: AgentMetrics, clock: Clock,
    pods: RunPod,
) -> None:
    ready, stopped, removed = pods("ready"), pods("stopped"), pods("removed")
    for pod in (ready, stopped, removed):
        _admit(ledger, pod.spec.uid)
    kubelet.stop_pod(stopped)
    kubelet.teardown(removed)
    assert sweeper.sweep() == {}  # all inside the grace window
    clock.now += GRACE + 1
    assert sweeper.sweep() == {stopped.spec.uid: SweepReason.FINISHED, removed.spec.uid: SweepReason.GONE}
    assert set(ledger.pods()) == {ready.spec.uid}
    assert ledger.held()["GPU-0"].core_percent == 25
    assert (_swept(metrics, "finished"), _swept(metrics, "gone")) == (1, 1)
    assert metrics.admitted_pods._value.get() == 1


def test_a_fresh_admission_stays_within_the_grace_even_though_the_runtime_has_no_sandbox_for_it(
    sweeper: AdmissionSweeper, ledger: AdmissionLedger, clock: Clock
) -> None:
    _admit(ledger, "not-yet-a-sandbox")
    clock.now += GRACE - 1
    assert sweeper.sweep() == {}
    assert set(ledger.pods()) == {"not-yet-a-sandbox"}


def test_an_unreachable_runtime_releases_nothing(ledger: AdmissionLedger, metrics: AgentMetrics, clock: Clock) -> None:
    base = tempfile.mkdtemp(prefix="fgpu-nort-")
    runtime = RuntimeClient(f"unix://{base}/absent.sock", request_timeout_s=2.0)
    sweeper = AdmissionSweeper(RuntimePods(runtime, node_name=NODE), ledger=ledger, metrics=metrics, clock=clock)
    _admit(ledger, "held")
    clock.now += GRACE + 1
    try:
        with pytest.raises(RuntimeUnavailable, match=r"absent\.sock: ListPodSandbox failed \(UNAVAILABLE"):
            sweeper.sweep()
    finally:
        runtime.close()
        shutil.rmtree(base, ignore_errors=True)
    assert set(ledger.pods()) == {"held"}
    assert _swept(metrics, "gone") == 0


def test_the_runtime_endpoint_is_a_config_key_and_a_flag_and_a_bad_one_is_refused_clearly() -> None:
    assert AgentConfig().runtime_endpoint == ""
    config = parse_config({"runtimeEndpoint": "unix:///run/containerd/containerd.sock"})
    assert config.runtime_endpoint == "unix:///run/containerd/containerd.sock"
    args = build_parser().parse_args(["--runtime-endpoint", "unix:///run/crio/crio.sock"])
    assert load_settings(args).runtime_endpoint == "unix:///run/crio/crio.sock"
    with pytest.raises(ConfigError, match=r"runtimeEndpoint='containerd'.*unix:///run/containerd/containerd\.sock"):
        parse_config({"runtimeEndpoint": "containerd"})
    with pytest.raises(ConfigError, match=r"runtimeEndpoint='unix://run/x.sock'"):
        load_settings(build_parser().parse_args(["--runtime-endpoint", "unix://run/x.sock"]))
    with pytest.raises(ConfigError, match="runtimeEndpoint=5 must be text"):
        parse_config({"runtimeEndpoint": 5})



def test_the_running_agent_without_kubernetes_sweeps_through_the_runtime_and_survives_it_being_away(
    containerd: Containerd, pods: RunPod  # noqa: F811
) -> None:
    alive = pods("alive")
    # Short: a unix socket path must fit in 108 bytes. The endpoint is a link made only later:
    # until then the runtime is "down".
    tmp = tempfile.mkdtemp(prefix="fgpu-crisw-")
    endpoint = os.path.join(tmp, "cri.sock")
    config = AgentConfig(
        node_name=NODE,
        report_to_kubernetes=False,
        runtime_endpoint=f"unix://{endpoint}",
        hook_listen=f"unix://{tmp}/hooks.sock",
        verifying_keys=os.path.join(tmp, "no-key"),
        metrics_listen="",
        admission_sweep_s=0.05,
        admission_sweep_grace_s=0.0,
        checkpoint_path=os.path.join(tmp, "no-checkpoint"),
        proc_root=os.path.join(tmp, "proc"),
    )
    inventory = load_inventory(T4)
    agent = Agent(config, node_name=NODE, nvml=FakeNVML(inventory), topology=InventoryTopology(inventory))
    _admit(agent.ledger, alive.spec.uid)
    _admit(agent.ledger, "gone")
    agent.start()
    try:
        loop = agent.sweep_loop
        assert loop is not None
        _wait(lambda: loop.failures >= 1)
        assert set(agent.ledger.pods()) == {alive.spec.uid, "gone"}
        os.symlink(containerd.socket_path, endpoint)
        _wait(lambda: set(agent.ledger.pods()) == {alive.spec.uid})
        assert agent.metrics.registry.get_sample_value(
            "fgpu_agent_report_errors_total", {"target": "admission-sweep"}
        ) == loop.failures
    finally:
        agent.stop(2)
        shutil.rmtree(tmp, ignore_errors=True)


# --- the ledger rebuild from the runtime's sandboxes -------------------------------------------------

KEY = signing_key("runtime-rebuild-test-key")


def _t4_share(index: int, core: int) -> GPUShare:
    gpu = T4_DEVICES.gpus[index]
    memory = 4 * 2**30
    return GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=core, memory_bytes=memory, memory_ratio_percent=25,
        containers=(ContainerShare("main", core, memory, 25),),
    )


def _signed(*shares: GPUShare) -> Callable[[str], dict[str, str]]:
    return lambda uid: allocation_annotations(KEY, pod_uid=uid, node_name=NODE, allocation=Allocation(gpus=shares))


def _hook_request(uid: str, annotations: dict[str, str]) -> hooks_pb2.ContainerHookRequest:
    return hooks_pb2.ContainerHookRequest(
        pod=hooks_pb2.PodSandboxMeta(name=f"pod-{uid}", namespace="team-a", uid=uid, annotations=annotations),
        container=hooks_pb2.ContainerMeta(name="main"),
    )


def test_the_runtime_lists_each_sandbox_with_its_pod_name_and_annotations(
    runtime: RuntimeClient, pods: RunPod
) -> None:
    pod = pods("annotated", annotations=lambda uid: {"example.com/owner": uid})
    listed = {s.id: s for s in runtime.list_pod_sandboxes()}[pod.sandbox_id]
    assert (listed.pod_namespace, listed.pod_name) == ("team-a", "annotated")
    assert listed.annotations["example.com/owner"] == pod.spec.uid


def test_a_restarted_agent_without_kubernetes_counts_the_gpu_shares_of_the_ready_sandboxes(
    containerd: Containerd, kubelet: Kubelet, pods: RunPod  # noqa: F811
) -> None:
    running = pods("holds-gpu0", annotations=_signed(_t4_share(0, 60)))
    stopped = pods("held-gpu1", annotations=_signed(_t4_share(1, 100)))
    kubelet.stop_pod(stopped)
    tmp = tempfile.mkdtemp(prefix="fgpu-crirb-")
    write_verifying_keys(os.path.join(tmp, "verifying-keys"), KEY)
    config = AgentConfig(
        node_name=NODE,
        report_to_kubernetes=False,
        runtime_endpoint=containerd.address,
        hook_listen=f"unix://{tmp}/hooks.sock",
        verifying_keys=os.path.join(tmp, "verifying-keys"),
        metrics_listen="",
        checkpoint_path=os.path.join(tmp, "no-checkpoint"),
        proc_root=os.path.join(tmp, "proc"),
    )
    inventory = load_inventory(T4)
    # A fresh agent object with an empty ledger: what a restart leaves.
    agent = Agent(config, node_name=NODE, nvml=FakeNVML(inventory), topology=InventoryTopology(inventory))
    agent.start()
    channel = grpc.insecure_channel(f"unix://{tmp}/hooks.sock")
    hook = hooks_pb2_grpc.RuntimeHooksStub(channel)  # type: ignore[no-untyped-call]
    try:
        assert set(agent.ledger.pods()) == {running.spec.uid}
        late = "late-pod-uid"
        over = hook.PreCreateContainer(_hook_request(late, _signed(_t4_share(0, 50))(late)), timeout=5)
        assert f"held by 1 pod(s) already admitted on this node ({running.spec.uid})" in over.rejection.reason
        # The stopped sandbox's claim on all of GPU 1 holds nothing.
        fits = hook.PreCreateContainer(_hook_request(late, _signed(_t4_share(1, 50))(late)), timeout=5)
        assert not fits.HasField("rejection"), fits.rejection.reason
    finally:
        channel.close()
        agent.stop(2)
        shutil.rmtree(tmp, ignore_errors=True)
