"""The kube-scheduler extender, fed the JSON bodies kube-scheduler really sends (fixtures/)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apis import names
from apis.signing import verify_pod_annotations
from scheduler_plugin.app import SchedulerApp
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, share_pod, t4_node
from tests.scheduler_service.conftest import KEY

FIXTURES = Path(__file__).parent / "fixtures"
FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@pytest.fixture
def extender(kube_api: KubeAPIServer, key_file: str) -> Iterator[tuple[SchedulerApp, str]]:
    yield from _extender(kube_api, key_file)


@pytest.fixture
def binpack_extender(kube_api: KubeAPIServer, key_file: str) -> Iterator[tuple[SchedulerApp, str]]:
    yield from _extender(kube_api, key_file, policy="binpack")


def _extender(kube_api: KubeAPIServer, key_file: str, *, policy: str = "") -> Iterator[tuple[SchedulerApp, str]]:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("gpu-h100-0", gpus=8))
    cluster.add_node(kube_api, t4_node("gpu-t4-0", gpus=4))
    kube_api.put_object(
        "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-0"}, "status": {"allocatable": {"cpu": "64"}}}
    )
    kube_api.put_object("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    cluster.add_pod(kube_api, fixture("pod-share.json"))
    app = cluster.start(cluster.config(kube_api, key_file, extender_listen="127.0.0.1:0", policy=policy))
    assert app.extender is not None
    yield app, f"http://127.0.0.1:{app.extender.port}/fgpu"
    app.stop(1.0)


def post(url: str, body: Any) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        return json.loads(response.read())


def test_filter_with_node_names_answers_node_names_and_reasons(extender: tuple[SchedulerApp, str]) -> None:
    _, url = extender

    result = post(f"{url}/filter", fixture("filter-nodecachecapable.json"))

    assert set(result) == FILTER_KEYS
    assert result["NodeNames"] == ["gpu-h100-0", "gpu-t4-0"]
    assert result["Nodes"] is None
    assert result["FailedNodes"] == {}
    assert list(result["FailedAndUnresolvableNodes"]) == ["cpu-0"]
    assert result["FailedAndUnresolvableNodes"]["cpu-0"]
    assert result["Error"] == ""


def test_filter_with_a_node_list_answers_the_passing_node_objects_unchanged(extender: tuple[SchedulerApp, str]) -> None:
    _, url = extender
    args = fixture("filter-nodelist.json")

    result = post(f"{url}/filter", args)

    assert result["NodeNames"] is None
    assert result["Nodes"]["items"] == [n for n in args["Nodes"]["items"] if n["metadata"]["name"] != "cpu-0"]
    assert "cpu-0" in result["FailedAndUnresolvableNodes"]


def test_filter_says_why_a_node_of_the_wrong_model_fails(extender: tuple[SchedulerApp, str]) -> None:
    _, url = extender
    args = fixture("filter-nodecachecapable.json")
    args["Pod"]["metadata"]["annotations"][names.GPU_MODEL_USE] = "T4"

    result = post(f"{url}/filter", args)

    assert result["NodeNames"] == ["gpu-t4-0"]
    assert "H100-80GB-HBM3" in result["FailedAndUnresolvableNodes"]["gpu-h100-0"]


def test_filter_of_an_invalid_pod_fails_every_node_with_the_pod_error(extender: tuple[SchedulerApp, str]) -> None:
    _, url = extender
    args = fixture("filter-nodecachecapable.json")
    args["Pod"]["spec"]["containers"][0]["resources"]["requests"][names.GPU_CORE] = "150"
    args["Pod"]["spec"]["containers"][0]["resources"]["limits"][names.GPU_CORE] = "150"

    result = post(f"{url}/filter", args)

    assert result["NodeNames"] == []
    reasons = set(result["FailedAndUnresolvableNodes"].values())
    assert len(reasons) == 1 and "150" in reasons.pop()


def test_filter_lets_a_pod_without_gpus_through_everywhere(extender: tuple[SchedulerApp, str]) -> None:
    _, url = extender
    args = fixture("filter-nodecachecapable.json")
    container = args["Pod"]["spec"]["containers"][0]["resources"]
    container["requests"] = {"cpu": "1"}
    container["limits"] = {}

    result = post(f"{url}/filter", args)

    assert result["NodeNames"] == ["gpu-h100-0", "gpu-t4-0", "cpu-0"]


def test_keys_are_read_case_insensitively_like_go_does(extender: tuple[SchedulerApp, str]) -> None:
    _, url = extender
    args = fixture("filter-nodecachecapable.json")

    result = post(f"{url}/filter", {"pod": args["Pod"], "nodenames": args["NodeNames"]})

    assert result["NodeNames"] == ["gpu-h100-0", "gpu-t4-0"]


def test_prioritize_answers_a_host_priority_list_from_0_to_10_preferring_the_fuller_node(
    binpack_extender: tuple[SchedulerApp, str], kube_api: KubeAPIServer
) -> None:
    app, url = binpack_extender
    assert app.service is not None
    app.service.bind(cluster.add_pod(kube_api, share_pod("already", core=50, memory="4Gi")), "gpu-t4-0")

    result = post(f"{url}/prioritize", fixture("prioritize-nodecachecapable.json"))

    assert [set(entry) for entry in result] == [{"Host", "Score"}] * 2
    scores = {entry["Host"]: entry["Score"] for entry in result}
    assert all(0 <= s <= 10 for s in scores.values())
    assert scores["gpu-t4-0"] > scores["gpu-h100-0"]


def test_prioritize_gives_the_node_the_scheduler_would_pick_the_only_top_score(
    binpack_extender: tuple[SchedulerApp, str], kube_api: KubeAPIServer
) -> None:
    app, url = binpack_extender
    assert app.service is not None
    app.service.bind(cluster.add_pod(kube_api, share_pod("already", core=50, memory="4Gi")), "gpu-t4-0")

    result = post(f"{url}/prioritize", fixture("prioritize-nodecachecapable.json"))

    # binpack picks the fuller T4 node; the H100 node must not tie with it.
    scores = {entry["Host"]: entry["Score"] for entry in result}
    assert scores["gpu-t4-0"] == 10
    assert scores["gpu-h100-0"] < 10


def test_prioritize_under_fgpu_has_exactly_one_top_score(extender: tuple[SchedulerApp, str]) -> None:
    _, url = extender

    result = post(f"{url}/prioritize", fixture("prioritize-nodecachecapable.json"))

    assert sorted(entry["Score"] for entry in result)[-1] == 10
    assert [entry["Score"] for entry in result].count(10) == 1


def test_bind_writes_the_signed_allocation_then_binds(extender: tuple[SchedulerApp, str], kube_api: KubeAPIServer) -> None:
    _, url = extender
    post(f"{url}/filter", fixture("filter-nodecachecapable.json"))

    result = post(f"{url}/bind", fixture("bind.json"))

    assert result == {"Error": ""}
    stored = cluster.get_pod(kube_api, "infer-7d9f8b6c5-x2x4q", "ml")
    assert stored["spec"]["nodeName"] == "gpu-h100-0"
    allocation = verify_pod_annotations(
        KEY.verifying_keys(), pod_uid=stored["metadata"]["uid"], node_name="gpu-h100-0", annotations=stored["metadata"]["annotations"]
    )
    assert allocation is not None and [g.core_percent for g in allocation.gpus] == [50]
    assert post(f"{url}/bind", fixture("bind.json")) == {"Error": ""}


def test_bind_without_a_prior_filter_reads_the_pod_from_the_api(extender: tuple[SchedulerApp, str], kube_api: KubeAPIServer) -> None:
    _, url = extender

    assert post(f"{url}/bind", fixture("bind.json")) == {"Error": ""}

    assert cluster.get_pod(kube_api, "infer-7d9f8b6c5-x2x4q", "ml")["spec"]["nodeName"] == "gpu-h100-0"


def test_bind_of_a_deleted_pod_reports_the_error_in_the_result(extender: tuple[SchedulerApp, str]) -> None:
    _, url = extender
    args = fixture("bind.json") | {"PodName": "gone"}

    result = post(f"{url}/bind", args)

    assert "gone" in result["Error"] and "not found" in result["Error"]


def test_a_body_that_is_not_json_gets_400_with_the_reason(extender: tuple[SchedulerApp, str]) -> None:
    _, url = extender

    with pytest.raises(urllib.error.HTTPError) as caught:
        post(f"{url}/filter", b"{not json")

    assert caught.value.code == 400
    assert b"not JSON" in caught.value.read()


@pytest.mark.parametrize(
    ("verb", "bad", "shown"), [("filter", None, b"null"), ("filter", 5, b"5"), ("prioritize", "", b'""')]
)
def test_a_node_name_that_is_not_a_string_gets_400_naming_the_field_and_value(
    extender: tuple[SchedulerApp, str], verb: str, bad: Any, shown: bytes
) -> None:
    _, url = extender
    args = fixture("filter-nodecachecapable.json")
    args["NodeNames"] = ["gpu-h100-0", bad]

    with pytest.raises(urllib.error.HTTPError) as caught:
        post(f"{url}/{verb}", args)

    assert caught.value.code == 400
    message = caught.value.read()
    assert b"ExtenderArgs.NodeNames[1]" in message and shown in message


def test_health_and_metrics_are_served_beside_the_verbs(extender: tuple[SchedulerApp, str]) -> None:
    _app, url = extender
    base = url.rsplit("/", 1)[0]
    post(f"{url}/filter", fixture("filter-nodecachecapable.json"))

    with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
        assert response.read() == b"ok"
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        text = response.read().decode()
    assert 'fgpu_scheduler_phase_duration_seconds_count{phase="filter"}' in text


def forged_filter_args(*, core: str = "100", uid: str = "") -> dict[str, Any]:
    """Filter args whose Pod claims the name of the API's pod but asks for other things."""
    args = fixture("filter-nodecachecapable.json")
    resources = args["Pod"]["spec"]["containers"][0]["resources"]
    for kind in ("requests", "limits"):
        resources[kind][names.GPU_CORE] = core
        resources[kind][names.GPU_MEMORY_RATIO] = core
    if uid:
        args["Pod"]["metadata"]["uid"] = uid
    return args


def test_bind_signs_the_pod_as_the_api_has_it_not_the_one_filter_carried(
    extender: tuple[SchedulerApp, str], kube_api: KubeAPIServer
) -> None:
    # Whoever can call filter must not choose what gets signed for a pod it only names.
    _, url = extender
    post(f"{url}/filter", forged_filter_args(core="100"))

    assert post(f"{url}/bind", fixture("bind.json")) == {"Error": ""}

    stored = cluster.get_pod(kube_api, "infer-7d9f8b6c5-x2x4q", "ml")
    allocation = verify_pod_annotations(
        KEY.verifying_keys(), pod_uid=stored["metadata"]["uid"], node_name="gpu-h100-0", annotations=stored["metadata"]["annotations"]
    )
    assert allocation is not None and [g.core_percent for g in allocation.gpus] == [50]


def test_bind_of_a_uid_the_api_pod_does_not_have_is_refused_even_after_a_filter_of_it(
    extender: tuple[SchedulerApp, str], kube_api: KubeAPIServer
) -> None:
    _, url = extender
    post(f"{url}/filter", forged_filter_args(core="50", uid="forged-uid"))

    result = post(f"{url}/bind", fixture("bind.json") | {"PodUID": "forged-uid"})

    assert "recreated" in result["Error"] and "forged-uid" in result["Error"]
    stored = cluster.get_pod(kube_api, "infer-7d9f8b6c5-x2x4q", "ml")
    assert not stored["spec"].get("nodeName")
    assert names.DEVICE_ALLOCATED not in (stored["metadata"].get("annotations") or {})
