"""Held-out review: rotating the signing key and ending the v1 window the way docs/deploy.md tells an operator to.

Cross-daemon: fgpu-scheduler (`SchedulingService`, keys from files as its Secret and ConfigMap volumes
hold them) signs pods that live in the Kubernetes API double; a real agent (its hook over gRPC, its
ledger rebuilt from the API on restart) admits them; `fgpuctl keys ...` runs on the official client's
`kubectl get pods -A -o json`-shaped output. A ConfigMap or Secret update is a file written into the
volume directory, as kubelet does it.

Found and fixed here: an idle agent never read (nor logged) a new key, so rotation step 1 could
not be waited on; a key or the v1 key leaving the set was not said when it happened; `keys in-use
--key` with a mistyped id printed no pod (read as "safe to drop"); an unreadable public key file
named no fix.

Already covered end to end elsewhere, so not repeated here:
- a key added / dropped while the agent runs, v1 admitted only with the legacy key, the agent
  reading its keys once they appear: tests/agent/test_verifying_keys.py;
- the scheduler switching its private key without a restart: tests/scheduler_service/test_signing_keys.py;
- bad edits keep the last good keys, a private key among the verifying keys, an empty directory
  (the key files alone): tests/apis_codec/test_keyfiles.py;
- copied / other-node / relabelled signatures (pure verification) and the ledger rebuild of each:
  tests/apis_codec/test_signing.py, tests/agent/test_ledger_rebuild.py.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Any
from unittest import mock

import grpc
import kubernetes
import pytest

from agent import daemon
from agent.config import AgentConfig
from agent.daemon import Agent
from agent.fakenvml import FakeNVML
from agent.fakenvml_inventory import load_inventory
from agent.kube import Kube
from agent.pcitopology import InventoryTopology
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, encode_allocation
from apis.fgpu.v1 import hooks_pb2, hooks_pb2_grpc
from apis.keyfiles import KeyWatcher, SchedulerKeyFiles, VerifyingKeyFiles, private_pem, public_pem
from apis.signing import SigningKey, allocation_annotations
from fgpuctl import main as fgpuctl
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.scheduling import SchedulingService
from tests.agent.helpers import T4
from tests.kubeapi import KubeAPIServer
from tests.scheduler_service.builders import share_pod
from tests.signing_keys import legacy_v1_signature, signing_key, write_signing_key
from tests.waiting import wait_until

NODE = "gpu-node-1"
A = signing_key("rotation-review-a")
B = signing_key("rotation-review-b")
LEGACY = b"rotation-review-v1-cluster-key"
PODS = "/api/v1/namespaces/ml/pods"


@dataclass
class Cluster:
    api: KubeAPIServer
    tmp: str
    #: The agent's `verifyingKeys`: the fgpu-verifying-keys ConfigMap volume.
    keys_dir: str
    #: The agent's `legacySigningKey`: the optional fgpu-signing-key Secret volume's file.
    legacy_file: str
    #: The scheduler's `signingKey`: the fgpu-scheduler-signing-key Secret volume's file.
    signing_file: str
    core: Any


@pytest.fixture
def cluster(kube_api: KubeAPIServer) -> Iterator[Cluster]:
    tmp = tempfile.mkdtemp(prefix="fgpu-rot-")  # short: a unix socket path must fit in 108 bytes
    keys_dir = os.path.join(tmp, "verifying-keys")
    os.makedirs(keys_dir)
    _configmap_add(keys_dir, A)
    kube_api.install_crd("hack/deploy/crds/device.yaml")  # the agent reports its Device quietly
    api_client = kubernetes.config.new_client_from_config(config_file=kube_api.kubeconfig_path)  # type: ignore[no-untyped-call]
    try:
        yield Cluster(
            api=kube_api, tmp=tmp, keys_dir=keys_dir, legacy_file=os.path.join(tmp, "legacy-key"),
            signing_file=write_signing_key(os.path.join(tmp, "signing-key.pem"), A),
            core=kubernetes.client.CoreV1Api(api_client),
        )
    finally:
        api_client.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _configmap_add(keys_dir: str, key: SigningKey) -> None:
    """What `kubectl patch configmap fgpu-verifying-keys -p "$(fgpuctl keys public --in KEY -o patch)"` leaves on a node."""
    with tempfile.NamedTemporaryFile("wb", suffix=".key", delete=False) as f:
        f.write(private_pem(key))
    try:
        out = io.StringIO()
        with redirect_stdout(out):
            assert fgpuctl.main(["keys", "public", "--in", f.name, "-o", "patch"]) == 0
    finally:
        os.unlink(f.name)
    for data_key, pem in json.loads(out.getvalue())["data"].items():
        with open(os.path.join(keys_dir, data_key), "w", encoding="ascii") as pub:
            pub.write(pem)


def _configmap_drop(keys_dir: str, key: SigningKey) -> None:
    """`kubectl patch configmap fgpu-verifying-keys -p '{"data":{"<id>.pub":null}}'`, as the node sees it."""
    os.unlink(os.path.join(keys_dir, f"{key.key_id}.pub"))


@contextlib.contextmanager
def _agent(
    c: Cluster, *, node: str = NODE, rebuilt: bool = True
) -> Iterator[tuple[Agent, hooks_pb2_grpc.RuntimeHooksStub]]:
    """A started agent on the fake T4 node; `rebuilt`: once its ledger is restored (it waits for usable keys)."""
    config = AgentConfig(
        node_name=node, report_to_kubernetes=False, hook_listen=f"unix://{c.tmp}/{node}.sock",
        verifying_keys=c.keys_dir, legacy_signing_key=c.legacy_file, metrics_listen="",
        admission_sweep_s=60.0, admission_sweep_grace_s=600.0,
        checkpoint_path=os.path.join(c.tmp, "no-checkpoint"), proc_root=os.path.join(c.tmp, "proc"),
    )
    inventory = load_inventory(T4)
    # Files looked at every 0.1 s instead of every second: the same behaviour, in the tests' time budget.
    with mock.patch.object(daemon, "VerifyingKeyFiles", functools.partial(VerifyingKeyFiles, min_interval_s=0.1)), \
            mock.patch.object(daemon, "KeyWatcher", functools.partial(KeyWatcher, interval_s=0.1)):
        agent = Agent(
            config, node_name=node, nvml=FakeNVML(inventory), topology=InventoryTopology(inventory),
            kube=Kube.connect(kubeconfig=c.api.kubeconfig_path, request_timeout_s=1.0),
        )
    agent.start()
    channel = grpc.insecure_channel(f"unix://{c.tmp}/{node}.sock")
    try:
        if rebuilt:
            wait_until(lambda: agent.rebuilder is not None and not agent.rebuilder.pending, timeout=10)
        yield agent, hooks_pb2_grpc.RuntimeHooksStub(channel)  # type: ignore[no-untyped-call]
    finally:
        channel.close()
        agent.stop(2)


@contextlib.contextmanager
def _scheduler(c: Cluster, agent: Agent) -> Iterator[SchedulingService]:
    """fgpu-scheduler with its Secret and ConfigMap volumes; a new one over the same state is a restart."""
    keys = SchedulerKeyFiles(c.signing_file, verifying_path=c.keys_dir, min_interval_s=0)
    backend = EmbeddedBackend(path=os.path.join(c.tmp, "state.db"))
    service = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=keys)
    backend.start(service)
    try:
        service.report_devices(agent.state.devices())
        yield service
    finally:
        backend.stop()


def _created(c: Cluster, name: str, *, core: int) -> dict[str, Any]:
    """A GPU pod created through the API (which gives it its UID), not yet bound."""
    pod = share_pod(name, core=core, memory="2Gi", namespace="ml", uid=None)
    return dict(json.loads(c.core.create_namespaced_pod("ml", pod, _preload_content=False).data))


def _running(c: Cluster, pod: dict[str, Any], annotations: Mapping[str, str]) -> dict[str, Any]:
    """`pod` bound to the node with `annotations`, its container running (as kubelet reports it): the pod as stored."""
    pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **annotations}
    pod["spec"]["nodeName"] = NODE
    pod["status"] = {"phase": "Running", "containerStatuses": [
        {"name": "main", "containerID": f"containerd://{pod['metadata']['name']}", "ready": True, "restartCount": 0,
         "image": "busybox", "imageID": "", "state": {"running": {}}},
    ]}
    return c.api.put_object(PODS, pod)


def _place(c: Cluster, scheduler: SchedulingService, name: str, *, core: int = 30) -> dict[str, Any]:
    """A pod created through the API and bound by the scheduler, its container running."""
    pod = _created(c, name, core=core)
    return _running(c, pod, scheduler.bind(pod, NODE).annotations)


def _running_pod(c: Cluster, name: str, *, signer: SigningKey | None, core: int = 30) -> dict[str, Any]:
    """A running pod with a share of the first GPU, signed by `signer`, or v1 (an older scheduler) when None.

    Signed here rather than by the scheduler, which would not overcommit a GPU (or write v1) on purpose.
    """
    gpu = load_inventory(T4).gpus[0]
    memory = 2 * 2**30
    share = GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=core, memory_bytes=memory, memory_ratio_percent=13,
        containers=(ContainerShare("main", core, memory, 13),),
    )
    pod = _created(c, name, core=core)
    uid = pod["metadata"]["uid"]
    allocation = Allocation(gpus=(share,))
    if signer is not None:
        return _running(c, pod, allocation_annotations(signer, pod_uid=uid, node_name=NODE, allocation=allocation))
    annotation = encode_allocation(allocation)
    return _running(c, pod, {
        names.DEVICE_ALLOCATED: annotation, names.ALLOCATION_NODE: NODE,
        names.ALLOCATION_SIGNATURE: legacy_v1_signature(LEGACY, pod_uid=uid, node_name=NODE, annotation=annotation),
    })


def _create(hook: hooks_pb2_grpc.RuntimeHooksStub, pod: dict[str, Any]) -> str:
    """kubelet creating the pod's container through the proxy: "" when admitted, else the rejection."""
    meta = pod["metadata"]
    response = hook.PreCreateContainer(
        hooks_pb2.ContainerHookRequest(
            pod=hooks_pb2.PodSandboxMeta(
                name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], annotations=meta["annotations"]
            ),
            container=hooks_pb2.ContainerMeta(name="main"),
        ),
        timeout=5,
    )
    return str(response.rejection.reason)


def _in_use(c: Cluster, *args: str) -> tuple[int, str]:
    """`kubectl get pods -A -o json | fgpuctl keys in-use ARGS`."""
    listing = c.core.list_pod_for_all_namespaces(_preload_content=False).data
    path = os.path.join(c.tmp, "pods.json")
    with open(path, "wb") as f:
        f.write(listing)
    out = io.StringIO()
    with redirect_stdout(out):
        status = fgpuctl.main(["keys", "in-use", "-f", path, *args])
    return status, out.getvalue()


def _uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


# --- 1 and 2: rotation with running pods, the scheduler ahead of a node ---------------------------------------


def test_a_rotation_done_as_documented_keeps_every_running_pod_admitted_and_counted(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with _agent(cluster) as (agent, hook), _scheduler(cluster, agent) as scheduler:
        old = [_place(cluster, scheduler, f"old-{i}") for i in range(2)]
        for pod in old:
            assert _create(hook, pod) == ""

        # Step 1: every node gets the new public key, and says so.
        _configmap_add(cluster.keys_dir, B)
        wait_until(lambda: any(
            "accepting keys" in r.getMessage() and B.key_id in r.getMessage() and A.key_id in r.getMessage()
            for r in caplog.records
        ), timeout=5)

        # Step 2: the scheduler's Secret changes; the next pod is signed with B and admitted.
        with open(cluster.signing_file, "wb") as f:
            f.write(private_pem(B))
        new = _place(cluster, scheduler, "new-0")
        assert new["metadata"]["annotations"][names.ALLOCATION_SIGNATURE].startswith(f"v2:{B.key_id}:")
        assert any(f"signing with key {B.key_id}" in r.getMessage() for r in caplog.records)
        assert _create(hook, new) == ""
        # A container of an old pod restarts: still admitted, still counted.
        assert _create(hook, old[0]) == ""
        assert set(agent.ledger.pods()) == {_uid(p) for p in (*old, new)}

        # Step 3: `in-use` names exactly the pods the old key still signs.
        status, table = _in_use(cluster)
        assert (status, sorted(table.splitlines())) == (0, sorted([f"KEY{' ' * 15}PODS", f"{A.key_id}  2", f"{B.key_id}  1"]))
        assert _in_use(cluster, "--key", A.key_id) == (0, "ml/old-0\nml/old-1\n")

        # The operator waits: the old pods end (their controller recreates them, signed with B).
        for pod in old:
            pod["status"]["phase"] = "Succeeded"
            cluster.api.put_object(PODS, pod)
        assert _in_use(cluster, "--key", A.key_id) == (0, "")
        _configmap_drop(cluster.keys_dir, A)
        wait_until(lambda: f"signed with key {A.key_id}" in _create(hook, old[0]), timeout=5)
        assert _create(hook, new) == ""

    # A restart after the rotation restores what runs.
    with _agent(cluster) as (restarted, _):
        assert set(restarted.ledger.pods()) == {_uid(new)}


def test_an_old_key_dropped_too_early_is_visible_and_its_pods_lose_their_count_only_on_an_agent_restart(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    with _agent(cluster) as (agent, hook):
        early = _running_pod(cluster, "early", signer=A, core=60)
        assert _create(hook, early) == ""
        _configmap_add(cluster.keys_dir, B)
        caplog.set_level(logging.INFO)

        _configmap_drop(cluster.keys_dir, A)  # `keys in-use --key A` would still have listed ml/early

        # Without a restart the running pod stays counted: a pod that would overcommit its GPU is refused...
        wait_until(lambda: f"signed with key {A.key_id}" in _create(hook, early), timeout=5)
        assert _uid(early) in agent.ledger.pods()
        gpu = agent.ledger.pods()[_uid(early)][0].gpu_uuid
        over = _running_pod(cluster, "over", signer=B, core=60)
        refused = _create(hook, over)
        assert gpu in refused and "already admitted on this node" in refused, refused
        # ...and the drop is said when it happens, with the command that lists the pods it strands.
        dropped = [r for r in caplog.records if r.levelno >= logging.WARNING and f"{A.key_id}" in r.getMessage()
                   and "fgpuctl keys in-use --key" in r.getMessage()]
        assert dropped, [r.getMessage() for r in caplog.records]
        cluster.api.put_object(PODS, {**over, "status": {"phase": "Failed"}})

    caplog.clear()
    with _agent(cluster) as (restarted, _):
        # A restarted agent cannot verify the pod any more: it says so, naming it, and counts it in a metric.
        assert _uid(early) not in restarted.ledger.pods()
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "ml/early" in r.getMessage()]
        assert any(f"signed with key {A.key_id}" in m and "not counted" in m for m in warned), warned
        assert restarted.metrics.registry.get_sample_value(
            "fgpu_agent_admissions_not_restored_total", {"reason": "unverified"}
        ) == 1


def test_a_scheduler_restarted_with_the_new_key_before_a_node_has_it_is_refused_there_until_the_node_reads_it(
    cluster: Cluster,
) -> None:
    with _agent(cluster) as (agent, hook):
        with open(cluster.signing_file, "wb") as f:
            f.write(private_pem(B))  # the Secret changed first, against step 1
        with _scheduler(cluster, agent) as restarted:
            pod = _place(cluster, restarted, "ahead")

        refused = _create(hook, pod)
        assert f"signed with key {B.key_id}, which is not one of the verifying keys here ({A.key_id})" in refused
        assert "add its public key to every node's verifyingKeys (`fgpuctl keys public`" in refused
        assert _uid(pod) not in agent.ledger.pods()

        _configmap_add(cluster.keys_dir, B)  # the node's ConfigMap volume catches up; no restart

        wait_until(lambda: _create(hook, pod) == "", timeout=5)  # kubelet's retry
        assert _uid(pod) in agent.ledger.pods()


def test_in_use_refuses_a_key_that_is_no_key_id_rather_than_print_no_pod(cluster: Cluster) -> None:
    # An empty answer tells the operator to drop the key: a typo (or the file name) must not give one.
    for wrong in (A.key_id.upper(), f"{A.key_id}.pub", A.key_id[:8]):
        status, out = _in_use(cluster, "--key", wrong)
        assert (status, out) == (2, ""), wrong


# --- 3: verifying-key files an operator gets wrong -----------------------------------------------------------


def test_bad_verifying_key_files_never_stop_the_agent_and_keep_the_last_good_set_naming_the_file_and_fix(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # The same key twice (a copy under another name) is one key.
    shutil.copy(os.path.join(cluster.keys_dir, f"{A.key_id}.pub"), os.path.join(cluster.keys_dir, "copy.pub"))
    with _agent(cluster) as (agent, hook), _scheduler(cluster, agent) as scheduler:
        assert agent._keys.verifying_keys().key_ids == (A.key_id,)
        pod = _place(cluster, scheduler, "p")
        assert _create(hook, pod) == ""
        caplog.set_level(logging.WARNING)
        bad = os.path.join(cluster.keys_dir, "bad.pub")

        def kept(fragment: str) -> bool:
            return any(
                "keeping the previous verifying keys" in r.getMessage() and bad in r.getMessage()
                and fragment in r.getMessage() for r in caplog.records
            )

        for content, fix in (
            (b"-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n", "fgpuctl keys public --in"),
            (private_pem(B), "nodes get public keys only"),
        ):
            with open(bad, "wb") as f:
                f.write(content)
            wait_until(functools.partial(kept, fix), timeout=5)
            assert _create(hook, pod) == ""
            os.unlink(bad)
        # Emptied: kept as well (all pods' container restarts would fail), and said.
        for name in os.listdir(cluster.keys_dir):
            os.unlink(os.path.join(cluster.keys_dir, name))
        wait_until(lambda: any("no public key file in the directory" in r.getMessage() for r in caplog.records), timeout=5)
        assert _create(hook, pod) == ""


def test_a_private_key_in_the_verifying_keys_at_start_refuses_every_gpu_allocation_saying_so(cluster: Cluster) -> None:
    os.unlink(os.path.join(cluster.keys_dir, f"{A.key_id}.pub"))
    leaked = os.path.join(cluster.keys_dir, f"{A.key_id}.pub")
    with open(leaked, "wb") as f:
        f.write(private_pem(A))  # the .key half put into the ConfigMap by mistake
    pod = _running_pod(cluster, "p", signer=A)
    with _agent(cluster, rebuilt=False) as (_, hook):
        refused = _create(hook, pod)
        assert refused.startswith(f"fgpu agent cannot verify GPU allocations: verifying key file {leaked} holds a private key")
        assert "nodes get public keys only" in refused


def test_keys_added_and_removed_rapidly_while_pods_start_never_crash_the_agent_and_end_on_the_final_set(
    cluster: Cluster,
) -> None:
    with _agent(cluster) as (agent, hook):
        pod_a, pod_b = _running_pod(cluster, "pa", signer=A), _running_pod(cluster, "pb", signer=B)
        answers: list[str] = []
        stop = threading.Event()

        def kubelet() -> None:
            while not stop.is_set():
                answers.append(_create(hook, pod_a))

        caller = threading.Thread(target=kubelet)
        caller.start()
        try:
            b_file = os.path.join(cluster.keys_dir, f"{B.key_id}.pub")
            for _ in range(200):
                with open(b_file, "wb") as f:
                    f.write(public_pem(B.public))
                os.unlink(b_file)
        finally:
            stop.set()
            caller.join()
        assert answers and set(answers) == {""}, set(answers)
        _configmap_add(cluster.keys_dir, B)
        wait_until(lambda: _create(hook, pod_b) == "", timeout=5)
        assert agent._keys.verifying_keys().key_ids == tuple(sorted((A.key_id, B.key_id)))


# --- 4: the v1 (HMAC) upgrade window ------------------------------------------------------------------------


def test_v1_pods_verify_in_the_window_and_after_it_are_refused_on_admission_but_keep_their_share(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    with open(cluster.legacy_file, "wb") as f:
        f.write(LEGACY + b"\n")  # the Secret fgpu-signing-key kept through the upgrade
    caplog.set_level(logging.WARNING)
    v1 = _running_pod(cluster, "v1-pod", signer=None, core=60)
    with _agent(cluster) as (agent, hook):
        assert any("accepting v1 (HMAC) allocation signatures" in r.getMessage() for r in caplog.records)
        assert _uid(v1) in agent.ledger.pods()  # restored at start: the window is open
        assert _create(hook, v1) == ""
        assert _in_use(cluster, "--key", "v1") == (0, "ml/v1-pod\n")

        os.unlink(cluster.legacy_file)  # step 3 too early: the Secret is deleted while the pod runs

        wait_until(lambda: "no legacySigningKey" in _create(hook, v1), timeout=5)
        late = _running_pod(cluster, "late-v1", signer=None, core=10)
        assert "carries a v1 (HMAC) signature" in _create(hook, late)
        # The running v1 pod keeps its share: a v2 pod that would overcommit its GPU is refused.
        assert _uid(v1) in agent.ledger.pods()
        over = _running_pod(cluster, "over", signer=A, core=60)
        assert "already admitted on this node" in _create(hook, over)
        assert any("fgpuctl keys in-use --key v1" in r.getMessage() for r in caplog.records)


# --- 5: annotations moved to another pod, another node, or relabelled ----------------------------------------


def test_an_allocation_moved_to_another_pod_or_node_or_relabelled_is_refused_saying_why(cluster: Cluster) -> None:
    _configmap_add(cluster.keys_dir, B)
    with _agent(cluster) as (agent, hook):
        x = _running_pod(cluster, "x", signer=A)
        y = _running_pod(cluster, "y", signer=A)
        copied = {**y, "metadata": {**y["metadata"], "annotations": dict(x["metadata"]["annotations"])}}
        refused = _create(hook, copied)
        assert f"does not match pod {_uid(y)} on node {NODE}" in refused and "made for another pod or node" in refused

        with _agent(cluster, node="gpu-node-2") as (_, other):
            assert f"allocation is for node {NODE!r}" in _create(other, x)
            unmarked = dict(x["metadata"]["annotations"])
            del unmarked[names.ALLOCATION_NODE]
            moved = {**x, "metadata": {**x["metadata"], "annotations": unmarked}}
            assert f"does not match pod {_uid(x)} on node gpu-node-2" in _create(other, moved)

        signature = x["metadata"]["annotations"][names.ALLOCATION_SIGNATURE]
        relabelled = signature.replace(A.key_id, B.key_id)
        annotations = {**x["metadata"]["annotations"], names.ALLOCATION_SIGNATURE: relabelled}
        forged = {**x, "metadata": {**x["metadata"], "annotations": annotations}}
        assert "does not match" in _create(hook, forged)
        assert _uid(x) not in agent.ledger.pods() and _uid(y) not in agent.ledger.pods()


def test_the_scheduler_keys_can_be_looked_at_without_a_pod_so_a_switch_is_logged_when_it_lands(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # What fgpu-scheduler would run in a `KeyWatcher` as the agent does (step 2 waits on this line).
    keys = SchedulerKeyFiles(cluster.signing_file, verifying_path=cluster.keys_dir, min_interval_s=0)
    caplog.set_level(logging.INFO)
    with open(cluster.signing_file, "wb") as f:
        f.write(b"not a key yet")  # a half-written Secret: kept, never raised
    keys.look()
    write_signing_key(cluster.signing_file, B)

    keys.look()

    assert any(f"signing with key {B.key_id}" in r.getMessage() for r in caplog.records)
    assert keys.signing_key() == B
