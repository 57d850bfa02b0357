"""Review of fgpu's documented interfaces with the clients that use them: each test a defect found, since fixed.

Each interface is driven as its real client drives it: the scheduler extender over HTTP with
kube-scheduler's `k8s.io/kube-scheduler/extender/v1` JSON, the webhook with AdmissionReview v1 bodies
as kube-apiserver sends them, the runtime proxy's admin socket with the real `grpcurl` and the gRPC
health protocol, the scheduler's /metrics as Prometheus scrapes it, and the command lines with a
broken kubeconfig. Each test was written failing (strict xfail) and its marker removed with the fix.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from apis import names
from apis.translation import TranslationRules
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.config import LeaderElectionConfig, SchedulerConfig, StateBackend
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, share_pod, t4_node
from tests.signing_keys import signing_key, write_signing_key
from tests.webhook.reviews import pod, review
from webhook.admission import Admission
from webhook.scope import Scope

KEY = signing_key("heldout-clients-review")
FIXTURES = Path(__file__).resolve().parents[1] / "scheduler_service" / "fixtures"
BIN = Path(sys.executable).parent


def _fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def _post(url: str, body: Any) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


# --- the scheduler extender, as kube-scheduler calls it --------------------------------------------


@pytest.fixture(scope="module")
def extender_url() -> Iterator[str]:
    """fgpu-scheduler in extender mode on the API double: an 8-GPU H100 node and a 4-GPU T4 node."""
    with tempfile.TemporaryDirectory(prefix="fgpu-review-") as directory, KubeAPIServer() as api:
        key_file = write_signing_key(str(Path(directory) / "signing-key"), KEY)
        cluster.install(api)
        cluster.add_node(api, gpu_node("gpu-h100-0", gpus=8))
        cluster.add_node(api, t4_node("gpu-t4-0", gpus=4))
        api.put_object("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
        app = cluster.start(cluster.config(api, key_file, extender_listen="127.0.0.1:0"))
        assert app.extender is not None
        try:
            yield f"http://127.0.0.1:{app.extender.port}/fgpu"
        finally:
            app.stop(1.0)


def test_filter_of_an_empty_candidate_list_answers_no_node_it_was_not_sent(extender_url: str) -> None:
    # kube-scheduler rejects an answer naming a node outside its input ("extender claims a filtered
    # node which is not found in the input node list"); scheduling.filter() reads [] as "all nodes".
    args = _fixture("filter-nodecachecapable.json") | {"NodeNames": []}

    result = _post(f"{extender_url}/filter", args)

    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_an_empty_node_list_as_go_encodes_it_is_an_empty_answer_not_a_400(extender_url: str, verb: str) -> None:
    # With nodeCacheCapable: false kube-scheduler builds `&v1.NodeList{}` and appends: no node leaves
    # Items a nil slice, which encoding/json writes as null.
    args = _fixture("filter-nodecachecapable.json") | {"NodeNames": None, "Nodes": {"metadata": {}, "items": None}}

    result = _post(f"{extender_url}/{verb}", args)

    assert result == [] if verb == "prioritize" else result["Nodes"]["items"] == []


def test_a_pod_author_cannot_mint_new_metric_series_with_its_annotations(extender_url: str) -> None:
    # fgpu.io/gpu-model-use is the pod author's; its value lands in the `reason` label verbatim
    # (digits only become N), so each edit of a pending pod's annotation adds a series for good.
    base = extender_url.rsplit("/", 1)[0]
    for word in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot"):
        args = _fixture("filter-nodecachecapable.json") | {"NodeNames": ["gpu-h100-0"]}
        args["Pod"]["metadata"]["annotations"][names.GPU_MODEL_USE] = f"review-model-{word}"
        _post(f"{extender_url}/filter", args)

    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        text = response.read().decode()
    series = [line for line in text.splitlines() if line.startswith("fgpu_scheduler_unschedulable_reasons_total{")]
    assert not any("review-model-" in line for line in series), series


@pytest.fixture
def embedded_extender() -> Iterator[tuple[str, Path]]:
    """fgpu-scheduler in extender mode on its SQLite state (no API): bind binds the pod filter carried.

    Yields the extender's URL and the state file, where a bound pod is stored as it was bound.
    """
    with tempfile.TemporaryDirectory(prefix="fgpu-review-") as directory:
        db = Path(directory) / "state.db"
        config = SchedulerConfig(
            state=StateBackend.EMBEDDED,
            db=str(db),
            grpc_listen=f"unix://{directory}/s.sock",
            extender_listen="127.0.0.1:0",
            signing_key=write_signing_key(str(Path(directory) / "signing-key"), KEY),
            leader_election=LeaderElectionConfig(enabled=False),
        )
        app = SchedulerApp(config)
        app.start()
        assert app.service is not None and app.extender is not None
        app.service.report_devices(gpu_node("n1", gpus=2))
        try:
            yield f"http://127.0.0.1:{app.extender.port}", db
        finally:
            app.stop(1.0)


def test_bind_of_a_pod_never_binds_another_pod_that_was_filtered_with_the_same_uid(
    embedded_extender: tuple[str, Path],
) -> None:
    # Extender._pod_for_bind looks the filter cache up by PodUID and ignores PodName/PodNamespace.
    url, db = embedded_extender
    small = share_pod("small", core=10, memory="1Gi")
    big = share_pod("big", core=100, memory="80Gi")
    small["metadata"]["uid"] = big["metadata"]["uid"] = "repeated-uid"
    _post(f"{url}/filter", {"Pod": small, "NodeNames": ["n1"]})
    _post(f"{url}/filter", {"Pod": big, "NodeNames": ["n1"]})

    result = _post(f"{url}/bind", {"PodName": "small", "PodNamespace": "default", "PodUID": "repeated-uid", "Node": "n1"})

    with contextlib.closing(sqlite3.connect(db)) as state:
        bound = [name for (name,) in state.execute("SELECT name FROM pods WHERE uid = 'repeated-uid'")]
    # Refused, or the pod kube-scheduler named is the one bound; never "big" in its place.
    assert result["Error"] or bound == ["small"], (result, bound)


# --- the admission webhook, as kube-apiserver calls it ---------------------------------------------

ADMISSION = Admission(scope=Scope(), rules=TranslationRules.default)


def _admit(path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, content_type, answer = ADMISSION.handle("POST", path, json.dumps(body).encode())
    assert status == 200 and content_type == "application/json", answer
    response: dict[str, Any] = json.loads(answer)["response"]
    return response


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("sub_resource", "gvk", "obj"),
    [
        ("binding", {"group": "", "version": "v1", "kind": "Binding"},
         {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p1", "namespace": "ml"}, "target": {"kind": "Node", "name": "n1"}}),
        ("eviction", {"group": "policy", "version": "v1", "kind": "Eviction"},
         {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p1", "namespace": "ml"}}),
    ],
)
def test_a_write_to_a_pod_subresource_of_another_kind_is_allowed_unchanged(
    path: str, sub_resource: str, gvk: dict[str, str], obj: dict[str, Any]
) -> None:
    # docs/webhook.md: "writes to a pod's subresources (pods/status, pods/binding, ...) are allowed as
    # they are". kube-apiserver sends them with resource pods and the subresource's own kind; a
    # configuration with `pods/*` and the validating webhook's Fail would then stop every bind.
    sent = review(obj, kind=gvk, sub_resource=sub_resource)

    answer = _admit(path, sent)

    assert answer == {"uid": sent["request"]["uid"], "allowed": True}


def test_the_webhooks_pod_checks_still_apply_after_the_subresource_fix() -> None:
    # Guard for the fix above: a Pod CREATE of a GPU pod is still patched (not waved through).
    sent = review(pod(resources={names.GPU_CORE: "50", names.GPU_MEMORY_RATIO: "50"}))
    assert _admit("/mutate", sent)["patchType"] == "JSONPatch"


# --- the runtime proxy's admin socket, with grpcurl and the health protocol -------------------------


@pytest.fixture(scope="module")
def proxy_admin() -> Iterator[str]:
    """fgpu-runtime-proxy whose runtime socket does not exist (containerd down); yields its admin socket."""
    directory = tempfile.mkdtemp(prefix="fgpu-rv-")  # short: unix socket paths end at 107 bytes
    hooks = Path(directory) / "hooks.d"
    hooks.mkdir()
    admin = f"{directory}/admin.sock"
    process = subprocess.Popen(
        [str(BIN / "fgpu-runtime-proxy"), "--listen", f"unix://{directory}/proxy.sock",
         "--backend", f"unix://{directory}/containerd-is-down.sock", "--hook-config-dir", str(hooks),
         "--admin-listen", f"unix://{admin}", "--metrics-listen", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not Path(admin).exists():
            assert process.poll() is None and time.monotonic() < deadline, "fgpu-runtime-proxy did not start"
            time.sleep(0.05)
        yield admin
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def test_grpcurl_describes_every_service_the_admin_socket_lists(proxy_admin: str) -> None:
    # docs/runtime-proxy.md: "grpcurl -plaintext -unix .../runtimeproxy-admin.sock list". An operator's
    # next command, `describe`, exits 1: "Symbol not found: runtime.v1.ImageService".
    described = subprocess.run(
        [str(BIN / "grpcurl"), "-plaintext", "-unix", proxy_admin, "describe"],
        capture_output=True, text=True, timeout=30, check=False,
    )

    assert described.returncode == 0, described.stderr


def test_the_admin_health_of_the_runtime_service_is_not_serving_while_containerd_is_down(proxy_admin: str) -> None:
    # docs/runtime-proxy.md: "runtime.v1.RuntimeService turns NOT_SERVING while containerd cannot be
    # dialled". Health is set only when a kubelet connection dials; until then it reads SERVING.
    time.sleep(0.5)
    with grpc.insecure_channel(f"unix://{proxy_admin}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=names.CRI_RUNTIME_SERVICE), timeout=5
        )

    assert answer.status != health_pb2.HealthCheckResponse.SERVING


# --- command lines and daemons with a kubeconfig that is not YAML ----------------------------------


@pytest.fixture(scope="module")
def broken_kubeconfig() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="fgpu-review-") as directory:
        path = Path(directory) / "kubeconfig"
        path.write_text("apiVersion: v1\nclusters: [\n")  # cut off mid-edit
        yield str(path)


@pytest.mark.parametrize(
    "argv",
    [["fgpuctl", "inspect"], ["kubectl-fgpu", "top"], ["fgpu-descheduler", "--metrics-port", "0"]],
    ids=["fgpuctl-inspect", "kubectl-fgpu-top", "fgpu-descheduler"],
)
def test_a_kubeconfig_that_is_not_yaml_gets_an_error_naming_the_flag_without_a_traceback(
    broken_kubeconfig: str, argv: list[str]
) -> None:
    # A missing file already gets "--kubeconfig='...': cannot load a Kubernetes client config (...);
    # give a valid kubeconfig"; scheduler_plugin/kube.py and agent/kube.py catch only ConfigException
    # and OSError, so a yaml.YAMLError escapes as it is.
    ran = subprocess.run(
        [str(BIN / argv[0]), *argv[1:], "--kubeconfig", broken_kubeconfig],
        capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
    )

    assert ran.returncode != 0
    assert "Traceback" not in ran.stderr, ran.stderr
    assert "--kubeconfig" in ran.stderr and broken_kubeconfig in ran.stderr, ran.stderr
