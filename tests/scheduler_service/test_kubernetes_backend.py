from __future__ import annotations

from collections.abc import Iterator

import pytest

from apis import names
from apis.signing import verify_pod_annotations
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.errors import BindFailed, Conflict
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, share_pod, whole_pod
from tests.scheduler_service.conftest import KEY
from tests.scheduler_service.views import state_of


@pytest.fixture
def apps() -> Iterator[list[SchedulerApp]]:
    started: list[SchedulerApp] = []
    yield started
    for app in started:
        app.stop(1.0)


def _start(api: KubeAPIServer, key_file: str, apps: list[SchedulerApp], *, policy: str = "") -> SchedulerApp:
    app = cluster.start(cluster.config(api, key_file, policy=policy))
    apps.append(app)
    return app


def test_bind_annotates_then_binds_the_pod_through_the_api(kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=2))
    pod = cluster.add_pod(kube_api, share_pod("p", core=50, memory="8Gi"))
    app = _start(kube_api, key_file, apps)
    assert app.service is not None

    signed = app.service.bind(pod, "n1")

    stored = cluster.get_pod(kube_api, "p")
    assert stored["spec"]["nodeName"] == "n1"
    allocation = verify_pod_annotations(KEY.verifying_keys(), pod_uid=pod["metadata"]["uid"], node_name="n1", annotations=stored["metadata"]["annotations"])
    assert allocation == signed.allocation


def test_restart_rebuilds_the_state_from_devices_and_pod_annotations(kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=4))
    cluster.add_node(kube_api, gpu_node("n2", gpus=2))
    # binpack stacks the shares so the 2-GPU pod still fits on n1 (fgpu may spread them).
    first = _start(kube_api, key_file, apps, policy="binpack")
    assert first.service is not None
    for i, node in enumerate(["n1", "n1", "n2", "n1"]):
        first.service.bind(cluster.add_pod(kube_api, share_pod(f"s{i}", core=40, memory="20Gi")), node)
    first.service.bind(cluster.add_pod(kube_api, whole_pod("w", gpus=2)), "n1")
    service = first.service
    cluster.eventually(lambda: all(not p.assumed for v in service.node_views() for g in v.gpus for p in g.pods), what="binds seen")
    before = state_of(first.service)
    first.stop(1.0)

    second = _start(kube_api, key_file, apps, policy="binpack")

    assert second.service is not None
    assert state_of(second.service) == before


def test_a_finished_pod_frees_its_gpu(kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    app = _start(kube_api, key_file, apps)
    assert app.service is not None
    app.service.bind(cluster.add_pod(kube_api, whole_pod("done")), "n1")
    finished = cluster.get_pod(kube_api, "done")
    finished["status"] = {"phase": "Succeeded"}
    kube_api.put_object("/api/v1/namespaces/default/pods", finished)

    cluster.eventually(lambda: app.service is not None and app.service.allocation_of(finished["metadata"]["uid"]) is None, what="release")

    app.service.bind(cluster.add_pod(kube_api, whole_pod("next")), "n1")


def test_a_failed_binding_call_writes_nothing_and_releases_the_reservation(
    kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    pod = cluster.add_pod(kube_api, whole_pod("p"))
    app = _start(kube_api, key_file, apps)
    assert app.service is not None
    kube_api.fail_next(1, status=500, path_contains="/binding")

    with pytest.raises(BindFailed, match="nothing was written"):
        app.service.bind(pod, "n1")

    stored = cluster.get_pod(kube_api, "p")
    assert names.DEVICE_ALLOCATED not in (stored["metadata"].get("annotations") or {})
    assert not stored["spec"].get("nodeName")
    assert app.service.allocation_of(pod["metadata"]["uid"]) is None
    retried = app.service.bind(cluster.get_pod(kube_api, "p"), "n1")
    assert cluster.get_pod(kube_api, "p")["metadata"]["annotations"][names.DEVICE_ALLOCATED] == retried.annotation


def test_a_pod_bound_elsewhere_meanwhile_is_a_conflict_and_keeps_its_annotations(
    kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    cluster.add_node(kube_api, gpu_node("n2", gpus=1))
    stale = cluster.add_pod(kube_api, whole_pod("p"))
    bound = dict(stale, spec={**stale["spec"], "nodeName": "n2"})
    bound["metadata"] = {**stale["metadata"], "annotations": {"someone": "else"}}
    kube_api.put_object("/api/v1/namespaces/default/pods", bound)
    app = _start(kube_api, key_file, apps)
    assert app.service is not None

    with pytest.raises(Conflict, match="n2"):
        app.service.bind(stale, "n1")

    stored = cluster.get_pod(kube_api, "p")
    assert stored["spec"]["nodeName"] == "n2"
    assert stored["metadata"]["annotations"] == {"someone": "else"}
    assert state_of(app.service)["n1"]["GPU-n1-00"] == (0, 0, ())


def test_an_api_server_restart_costs_a_relist_not_the_state(kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp]) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    app = _start(kube_api, key_file, apps)
    assert app.service is not None
    app.service.bind(cluster.add_pod(kube_api, whole_pod("a")), "n1")

    kube_api.restart(keep_state=True)
    cluster.add_node(kube_api, gpu_node("n2", gpus=1))

    service = app.service
    cluster.eventually(lambda: any(v.name == "n2" for v in service.node_views()), what="n2 seen after API restart")
    assert state_of(service)["n1"]["GPU-n1-00"][0] == 100
