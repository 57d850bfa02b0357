"""A restarted agent rebuilds its admission ledger from the running pods' verified allocations."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import grpc
import pytest

from agent.admissions import AdmissionLedger, Hold
from agent.admissionsweep import PodSeen
from agent.config import AgentConfig
from agent.criclient import Sandbox
from agent.daemon import Agent
from agent.discovery import discover
from agent.errors import KubeAPIError
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.kube import Kube
from agent.ledger_rebuild import LedgerRebuilder, SkipReason, restored_admissions
from agent.metrics import AgentMetrics
from agent.pcitopology import InventoryTopology
from agent.podsources import pods_seen, sandboxes_seen
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare
from apis.devices import NodeDevices
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from apis.signing import SigningKey, SigningKeyError, VerifyingKeys, allocation_annotations
from tests.agent.helpers import A100_MIG, T4, started_fake
from tests.kubeapi import KubeAPIServer
from tests.signing_keys import signing_key, verifying, write_verifying_keys
from tests.waiting import wait_until as _wait

KEY = signing_key("ledger-rebuild-test-key")
KEYS = verifying(KEY)
NODE = "gpu-node-1"
GiB = 2**30


def _devices(path: str = T4) -> NodeDevices:
    nvml, inventory = started_fake(path)
    return discover(nvml, node_name=NODE, topology=InventoryTopology(inventory)).devices


T4_DEVICES = _devices(T4)
MIG_DEVICES = _devices(A100_MIG)


def _share(devices: NodeDevices, index: int, *, core: int, memory: int = 4 * GiB, ratio: int = 25) -> GPUShare:
    gpu = devices.gpus[index]
    return GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=core, memory_bytes=memory, memory_ratio_percent=ratio,
        containers=(ContainerShare("main", core, memory, ratio),),
    )


def _mig_share(devices: NodeDevices, index: int, instance: int) -> GPUShare:
    gpu = devices.gpus[index]
    mig = gpu.mig_instances[instance]
    return GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=100, memory_bytes=mig.memory_bytes, memory_ratio_percent=100,
        mig_uuid=mig.uuid, containers=(ContainerShare("main", 100, mig.memory_bytes, 100),),
    )


def _signed(uid: str, *shares: GPUShare, node: str = NODE, key: SigningKey = KEY) -> dict[str, str]:
    return allocation_annotations(key, pod_uid=uid, node_name=node, allocation=Allocation(gpus=shares))


def _tampered(annotations: dict[str, str]) -> dict[str, str]:
    value = annotations[names.DEVICE_ALLOCATED]
    return {**annotations, names.DEVICE_ALLOCATED: value.replace('"60"', '"100"')}


@dataclass(frozen=True)
class Case:
    pods: tuple[PodSeen, ...]
    entries: tuple[tuple[str, tuple[Hold, ...]], ...]
    skipped: tuple[tuple[str, SkipReason], ...] = ()
    devices: NodeDevices = T4_DEVICES


GPU0 = T4_DEVICES.gpus[0].uuid
SIXTY = _share(T4_DEVICES, 0, core=60)

CASES = {
    "a signed running pod holds its share of the GPU": Case(
        pods=(PodSeen(uid="a", name="ml/a", annotations=_signed("a", SIXTY)),),
        entries=(("a", (Hold(gpu_uuid=GPU0, core_percent=60, memory_bytes=4 * GiB),)),),
    ),
    "a share given as a memory ratio holds that part of the GPU's memory": Case(
        pods=(PodSeen(uid="a", annotations=_signed("a", replace(SIXTY, memory_bytes=0, memory_ratio_percent=50))),),
        entries=(("a", (Hold(gpu_uuid=GPU0, core_percent=60, memory_bytes=T4_DEVICES.gpus[0].memory_bytes // 2),)),),
    ),
    "a tampered annotation is not counted": Case(
        pods=(PodSeen(uid="a", annotations=_tampered(_signed("a", SIXTY))),),
        entries=(),
        skipped=(("a", SkipReason.UNVERIFIED),),
    ),
    "an allocation signed for another node is not counted": Case(
        pods=(PodSeen(uid="a", annotations=_signed("a", SIXTY, node="gpu-node-2")),),
        entries=(),
        skipped=(("a", SkipReason.UNVERIFIED),),
    ),
    "an allocation copied from another pod is not counted": Case(
        pods=(PodSeen(uid="copy", annotations=_signed("a", SIXTY)),),
        entries=(),
        skipped=(("copy", SkipReason.UNVERIFIED),),
    ),
    "an allocation signed with another key is not counted": Case(
        pods=(PodSeen(uid="a", annotations=_signed("a", SIXTY, key=signing_key("another-scheduler"))),),
        entries=(),
        skipped=(("a", SkipReason.UNVERIFIED),),
    ),
    "an empty gpu list holds nothing": Case(
        pods=(PodSeen(uid="a", annotations=_signed("a")),),
        entries=(),
        skipped=(("a", SkipReason.HOLDS_NOTHING),),
    ),
    "a share of a gpu that is not on the node holds nothing": Case(
        pods=(PodSeen(uid="a", annotations=_signed("a", replace(SIXTY, uuid="GPU-gone", minor=9))),),
        entries=(),
        skipped=(("a", SkipReason.HOLDS_NOTHING),),
    ),
    "a finished pod is not counted": Case(
        pods=tuple(pods_seen([{
            "metadata": {"uid": "a", "name": "a", "namespace": "ml", "annotations": _signed("a", SIXTY)},
            "status": {"phase": "Failed"},
        }])),
        entries=(),
        skipped=(("a", SkipReason.FINISHED),),
    ),
    "a notready sandbox is not counted": Case(
        pods=tuple(sandboxes_seen([Sandbox(id="s1", pod_uid="a", ready=False, annotations=_signed("a", SIXTY))])),
        entries=(),
        skipped=(("a", SkipReason.FINISHED),),
    ),
    "a pod whose sandbox was recreated counts once from its ready sandbox": Case(
        pods=tuple(sandboxes_seen([
            Sandbox(id="old", pod_uid="a", ready=False, annotations=_signed("a", SIXTY)),
            Sandbox(id="new", pod_uid="a", ready=True, annotations=_signed("a", SIXTY)),
        ])),
        entries=(("a", (Hold(gpu_uuid=GPU0, core_percent=60, memory_bytes=4 * GiB),)),),
    ),
    "a pod without an allocation is neither counted nor skipped": Case(
        pods=(PodSeen(uid="a", annotations={"team": "ml"}),),
        entries=(),
    ),
    "a mig share holds its instance": Case(
        pods=(PodSeen(uid="m", annotations=_signed("m", _mig_share(MIG_DEVICES, 1, 1))),),
        entries=(("m", (Hold(
            gpu_uuid=MIG_DEVICES.gpus[1].uuid, mig_uuid=MIG_DEVICES.gpus[1].mig_instances[1].uuid, core_percent=100,
        ),)),),
        devices=MIG_DEVICES,
    ),
    "a share of a gpu that is unhealthy now still counts": Case(
        pods=(PodSeen(uid="a", annotations=_signed("a", SIXTY)),),
        entries=(("a", (Hold(gpu_uuid=GPU0, core_percent=60, memory_bytes=4 * GiB),)),),
        devices=replace(T4_DEVICES, gpus=(replace(T4_DEVICES.gpus[0], healthy=False), *T4_DEVICES.gpus[1:])),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_restored_admissions(case: Case) -> None:
    restored = restored_admissions(case.pods, key=KEYS, node_name=NODE, devices=case.devices)
    assert restored.entries == case.entries
    assert tuple((s.uid, s.reason) for s in restored.skipped) == case.skipped


def test_a_skipped_pod_says_who_and_why() -> None:
    restored = restored_admissions(
        [PodSeen(uid="a", name="ml/trainer-0", annotations=_signed("a", SIXTY, node="gpu-node-2"))],
        key=KEYS, node_name=NODE, devices=T4_DEVICES,
    )
    (skipped,) = restored.skipped
    assert skipped.pod == "ml/trainer-0 (a)"
    assert "allocation is for node 'gpu-node-2'" in skipped.detail


# --- the rebuilder against a source ----------------------------------------------------------------


class ListedPods:
    """A PodSource that lists what the test says, or fails like a peer that is down."""

    where = f"on node {NODE} (test)"

    def __init__(self, pods: list[PodSeen]) -> None:
        self.pods = pods
        self.down = False
        self.calls = 0

    def list_pods(self) -> list[PodSeen]:
        self.calls += 1
        if self.down:
            raise KubeAPIError("Kubernetes API unreachable: connection refused")
        return list(self.pods)


def _rebuilder(
    source: ListedPods, ledger: AdmissionLedger, metrics: AgentMetrics, *,
    devices: Callable[[], NodeDevices] = lambda: T4_DEVICES, key: Callable[[], VerifyingKeys] = lambda: KEYS,
) -> LedgerRebuilder:
    return LedgerRebuilder(source, ledger=ledger, metrics=metrics, node_name=NODE, key=key, devices=devices)


def test_entries_recorded_by_real_admissions_win_and_nothing_is_released() -> None:
    ledger, metrics = AdmissionLedger(), AgentMetrics()
    admitted = (Hold(gpu_uuid=GPU0, core_percent=30, memory_bytes=GiB),)
    ledger.record(pod_uid="a", holds=admitted)
    ledger.record(pod_uid="not-listed", holds=admitted)
    thirty = _share(T4_DEVICES, 0, core=30)
    source = ListedPods([PodSeen(uid="a", annotations=_signed("a", thirty)), PodSeen(uid="b", annotations=_signed("b", SIXTY))])
    assert _rebuilder(source, ledger, metrics).rebuild()
    assert ledger.pods() == {"a": admitted, "not-listed": admitted, "b": (Hold(GPU0, 60, 4 * GiB),)}
    assert metrics.registry.get_sample_value("fgpu_agent_admissions_restored_total") == 1
    assert metrics.admitted_pods._value.get() == 3


def test_a_failed_listing_restores_nothing_and_a_later_attempt_does() -> None:
    ledger, metrics = AdmissionLedger(), AgentMetrics()
    source = ListedPods([PodSeen(uid="a", annotations=_signed("a", SIXTY))])
    source.down = True
    rebuilder = _rebuilder(source, ledger, metrics)
    with pytest.raises(KubeAPIError):
        rebuilder.rebuild()
    assert (rebuilder.pending, rebuilder.tried, ledger.pods()) == (True, True, {})
    source.down = False
    assert rebuilder.rebuild()
    assert set(ledger.pods()) == {"a"}
    assert not rebuilder.pending
    assert rebuilder.rebuild() and source.calls == 2  # done: it does not list again


def test_the_rebuild_waits_for_discovered_gpus_and_a_readable_key_without_listing() -> None:
    ledger, metrics = AdmissionLedger(), AgentMetrics()
    source = ListedPods([PodSeen(uid="a", annotations=_signed("a", SIXTY))])
    devices = [NodeDevices(node_name=NODE, discovery_error="NVML not initialised yet")]
    keys: list[VerifyingKeys] = []

    def key() -> VerifyingKeys:
        if not keys:
            raise SigningKeyError("allocation signing key file /etc/fgpu/signing.key does not exist")
        return keys[0]

    rebuilder = _rebuilder(source, ledger, metrics, devices=lambda: devices[0], key=key)
    assert not rebuilder.rebuild()
    devices[0] = T4_DEVICES
    assert not rebuilder.rebuild()
    assert (source.calls, rebuilder.tried) == (0, False)
    keys.append(KEYS)
    assert rebuilder.rebuild()
    assert set(ledger.pods()) == {"a"}


def test_unverified_allocations_are_counted_in_a_metric_by_reason() -> None:
    ledger, metrics = AdmissionLedger(), AgentMetrics()
    source = ListedPods([
        PodSeen(uid="forged", annotations=_tampered(_signed("forged", SIXTY))),
        PodSeen(uid="empty", annotations=_signed("empty")),
    ])
    assert _rebuilder(source, ledger, metrics).rebuild()
    assert ledger.pods() == {}
    for reason in ("unverified", "holds-nothing"):
        assert metrics.registry.get_sample_value("fgpu_agent_admissions_not_restored_total", {"reason": reason}) == 1


# --- the agent, restarted, against the Kubernetes API double -------------------------------------------


def _pod(uid: str, annotations: dict[str, str], *, phase: str = "Running") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{uid}", "namespace": "ml", "uid": uid, "annotations": annotations},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": phase},
    }


def _request(uid: str, annotations: dict[str, str]) -> hooks_pb2.ContainerHookRequest:
    return hooks_pb2.ContainerHookRequest(
        pod=hooks_pb2.PodSandboxMeta(name=f"pod-{uid}", namespace="ml", uid=uid, annotations=annotations),
        container=hooks_pb2.ContainerMeta(name="main"),
    )



@pytest.fixture
def workdir() -> Iterator[str]:
    # Short: a unix socket path must fit in 108 bytes.
    tmp = tempfile.mkdtemp(prefix="fgpu-lrb-")
    write_verifying_keys(os.path.join(tmp, "verifying-keys"), KEY)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _agent(kube_api: KubeAPIServer, tmp: str, *, sweep_s: float = 60.0) -> Agent:
    config = AgentConfig(
        node_name=NODE,
        report_to_kubernetes=True,
        hook_listen=f"unix://{tmp}/hooks.sock",
        verifying_keys=os.path.join(tmp, "verifying-keys"),
        metrics_listen="",
        admission_sweep_s=sweep_s,
        admission_sweep_grace_s=600.0,
        checkpoint_path=os.path.join(tmp, "no-checkpoint"),
        proc_root=os.path.join(tmp, "proc"),
    )
    inventory = load_inventory(T4)
    return Agent(
        config,
        node_name=NODE,
        nvml=FakeNVML(inventory),
        topology=InventoryTopology(inventory),
        kube=Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=1.0),
    )


def _hook(tmp: str) -> tuple[grpc.Channel, hooks_pb2_grpc.RuntimeHooksStub]:
    channel = grpc.insecure_channel(f"unix://{tmp}/hooks.sock")
    return channel, hooks_pb2_grpc.RuntimeHooksStub(channel)  # type: ignore[no-untyped-call]


def test_a_restarted_agent_refuses_a_pod_that_would_overcommit_a_gpu_held_by_a_running_pod(
    kube_api: KubeAPIServer, workdir: str
) -> None:
    running = _signed("running", SIXTY)
    forged = _tampered(_signed("forged", _share(T4_DEVICES, 1, core=60)))
    kube_api.put_object("/api/v1/namespaces/ml/pods", _pod("running", running))
    kube_api.put_object("/api/v1/namespaces/ml/pods", _pod("forged", forged))
    kube_api.put_object("/api/v1/namespaces/ml/pods", _pod("done", _signed("done", _share(T4_DEVICES, 2, core=100)),
                                                           phase="Succeeded"))
    first = _agent(kube_api, workdir)
    first.start()
    channel, hook = _hook(workdir)
    try:
        assert not hook.PreCreateContainer(_request("running", running), timeout=5).HasField("rejection")
    finally:
        channel.close()
        first.stop(2)

    restarted = _agent(kube_api, workdir)
    restarted.start()
    channel, hook = _hook(workdir)
    try:
        assert set(restarted.ledger.pods()) == {"running"}
        over = hook.PreCreateContainer(_request("late", _signed("late", _share(T4_DEVICES, 0, core=50))), timeout=5)
        assert f"GPU {GPU0}" in over.rejection.reason
        assert "held by 1 pod(s) already admitted on this node (running)" in over.rejection.reason
        # The forged pod's claim on GPU 1 and the finished pod's on GPU 2 block no one.
        for uid, index in (("next-to-forged", 1), ("after-done", 2)):
            fits = hook.PreCreateContainer(_request(uid, _signed(uid, _share(T4_DEVICES, index, core=50))), timeout=5)
            assert not fits.HasField("rejection"), fits.rejection.reason
        assert restarted.metrics.registry.get_sample_value("fgpu_agent_admissions_restored_total") == 1
    finally:
        channel.close()
        restarted.stop(2)


def test_while_the_running_pods_cannot_be_listed_gpu_allocations_wait_and_other_pods_do_not(
    kube_api: KubeAPIServer, workdir: str
) -> None:
    running = _signed("running", SIXTY)
    kube_api.put_object("/api/v1/namespaces/ml/pods", _pod("running", running))
    agent = _agent(kube_api, workdir, sweep_s=0.05)
    kube_api.pause()
    resumed = False
    try:
        agent.start()  # the rebuild's listing times out (1 s); the agent starts anyway
        channel, hook = _hook(workdir)
        try:
            assert agent.ledger.pods() == {}
            assert agent.rebuilder is not None and agent.rebuilder.pending
            # Admitting now could overcommit GPU 0 next to `running`, which nobody has counted yet.
            overcommit = _signed("overcommit", _share(T4_DEVICES, 0, core=50))
            waiting = hook.PreCreateContainer(_request("overcommit", overcommit), timeout=5)
            assert "not yet restored" in waiting.rejection.reason
            # A pod without GPUs is not held back.
            plain = hook.PreCreateContainer(_request("plain", {}), timeout=5)
            assert not plain.HasField("rejection") and not plain.set_envs
            kube_api.resume()
            resumed = True
            _wait(lambda: agent.rebuilder is not None and not agent.rebuilder.pending)
            assert agent.ledger.pods() == {"running": (Hold(GPU0, 60, 4 * GiB),)}
            # kubelet's retry: now refused for the right reason, and a pod that fits goes through.
            retry = hook.PreCreateContainer(_request("overcommit", overcommit), timeout=5)
            assert "held by 1 pod(s) already admitted on this node (running)" in retry.rejection.reason
            fits = _signed("fits", _share(T4_DEVICES, 0, core=40))
            assert not hook.PreCreateContainer(_request("fits", fits), timeout=5).HasField("rejection")
        finally:
            channel.close()
    finally:
        if not resumed:
            kube_api.resume()
        agent.stop(2)


def test_of_two_signed_pods_that_overcommit_a_gpu_the_one_with_a_running_container_is_restored() -> None:
    # The scheduler's view was stale: both carry a valid 60% allocation on one GPU. The hook admitted
    # the one that runs and refused the other, which waits on the node; only the first holds the GPU.
    running = PodSeen(uid="z-running", annotations=_signed("z-running", SIXTY), started=True, created="2026-12-01T10:00:05Z")
    refused = PodSeen(uid="a-refused", annotations=_signed("a-refused", SIXTY), created="2026-12-01T10:00:00Z")
    decision = restored_admissions([refused, running], key=KEYS, node_name=NODE, devices=T4_DEVICES)
    assert [uid for uid, _ in decision.entries] == ["z-running"]
    assert [(s.uid, s.reason) for s in decision.skipped] == [("a-refused", SkipReason.OVERCOMMIT)]


def test_without_container_states_the_older_of_two_overcommitting_pods_is_restored() -> None:
    older = PodSeen(uid="b", annotations=_signed("b", SIXTY), created="00000000000000000100")
    newer = PodSeen(uid="a", annotations=_signed("a", SIXTY), created="00000000000000000200")
    decision = restored_admissions([newer, older], key=KEYS, node_name=NODE, devices=T4_DEVICES)
    assert [uid for uid, _ in decision.entries] == ["b"]


def test_the_decision_says_which_live_sandbox_each_restored_pod_runs_in() -> None:
    listed = [
        PodSeen(uid="p", annotations=_signed("p", SIXTY), finished=True, sandbox_id="sb-old"),
        PodSeen(uid="p", annotations=_signed("p", SIXTY), sandbox_id="sb-new"),
        PodSeen(uid="q", annotations=_signed("q", _share(T4_DEVICES, 1, core=20))),  # from the API: not known
    ]
    restored = restored_admissions(listed, key=KEYS, node_name=NODE, devices=T4_DEVICES)
    assert [uid for uid, _ in restored.entries] == ["p", "q"]
    assert restored.sandboxes == {"p": "sb-new"}
