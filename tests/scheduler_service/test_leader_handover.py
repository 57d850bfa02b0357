"""Handing leadership over: the lease goes back only after the binds in flight landed, and whoever takes
over, however long it waited, decides on a fresh listing."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from apis import names
from scheduler_plugin.app import SchedulerApp
from scheduler_plugin.backend import Backend
from scheduler_plugin.kube import Kube
from scheduler_plugin.leader import LeaderElector
from tests.kubeapi.server import KubeAPIServer
from tests.kubeapi.store import Store
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, whole_pod

LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{names.LEADER_LEASE_NAME}"


@pytest.fixture
def apps() -> Iterator[list[SchedulerApp]]:
    started: list[SchedulerApp] = []
    yield started
    for app in started:
        app.stop(1.0)


@pytest.fixture
def slow_bindings(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The API double applies each Binding a second after it arrived; the event is set when one arrives."""
    arrived = threading.Event()
    original = Store.bind

    def slow(self: Store, namespace: str, name: str, binding: Any) -> dict[str, Any]:
        arrived.set()
        time.sleep(1.0)
        return original(self, namespace, name, binding)

    monkeypatch.setattr(Store, "bind", slow)
    return arrived


@pytest.fixture
def slow_pod_reads(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The API double answers a read of one pod a second late; the event is set when one arrives."""
    arrived = threading.Event()
    original = Store.get

    def slow(self: Store, resource: Any, namespace: str | None, name: str) -> dict[str, Any]:
        if resource.kind == "Pod":
            arrived.set()
            time.sleep(1.0)
        return original(self, resource, namespace, name)

    monkeypatch.setattr(Store, "get", slow)
    return arrived


def _versions(api: KubeAPIServer, pod: str) -> tuple[str, int, str, int]:
    """(node the pod is bound to, its resourceVersion, the lease holder, the lease's resourceVersion)."""
    bound = cluster.get_pod(api, pod)
    lease = api.get_object(LEASE_PATH)
    assert lease is not None
    return (
        bound["spec"].get("nodeName", ""),
        int(bound["metadata"]["resourceVersion"]),
        lease["spec"].get("holderIdentity") or "",
        int(lease["metadata"]["resourceVersion"]),
    )


def test_stopping_lets_the_extender_bind_in_flight_finish_before_the_lease_is_handed_back(
    kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp], slow_pod_reads: threading.Event
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    pod = cluster.add_pod(kube_api, whole_pod("p"))
    app = cluster.start(cluster.config(kube_api, key_file, extender_listen="127.0.0.1:0", lease_s=30.0), identity="a")
    apps.append(app)
    assert app.extender is not None and app.is_leader()
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "n1"}
    request = urllib.request.Request(
        f"http://127.0.0.1:{app.extender.port}/fgpu/bind", data=json.dumps(args).encode(), method="POST"
    )
    answers: list[Any] = []

    def kube_scheduler_binds() -> None:
        with urllib.request.urlopen(request, timeout=10) as response:
            answers.append(json.loads(response.read()))

    caller = threading.Thread(target=kube_scheduler_binds)
    caller.start()
    assert slow_pod_reads.wait(5)  # the bind reads the pod it names from the API, before it reserves and binds

    app.stop(1.0)  # SIGTERM
    caller.join(5)

    assert answers == [{"Error": ""}]  # not "standby": this instance led until its binds were done
    node, pod_rv, holder, lease_rv = _versions(kube_api, "p")
    assert (node, holder) == ("n1", "")  # bound, and the lease handed back...
    assert lease_rv > pod_rv  # ...after the Binding landed, not while it was in flight


def test_the_elector_hands_the_lease_back_only_after_its_fenced_writes_in_flight_ended(
    kube_api: KubeAPIServer, slow_bindings: threading.Event
) -> None:
    pod = cluster.add_pod(kube_api, whole_pod("p"))
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path)
    elector = LeaderElector(
        kube=kube, namespace="kube-system", name=names.LEADER_LEASE_NAME, identity="a",
        lease_duration_s=30.0, renew_deadline_s=20.0, retry_period_s=3600.0,
    )
    elector.start()
    writer = threading.Thread(
        target=lambda: kube.bind_pod(namespace="default", name="p", uid=pod["metadata"]["uid"], node="n1")
    )
    writer.start()
    try:
        assert slow_bindings.wait(5)
        elector.stop(release=True)  # e.g. a bind thread that outlived the servers' drain
    finally:
        writer.join(5)
        kube.close()

    node, pod_rv, holder, lease_rv = _versions(kube_api, "p")
    assert (node, holder) == ("n1", "")
    assert lease_rv > pod_rv


def test_a_standby_that_takes_over_later_decides_on_a_fresh_listing(
    kube_api: KubeAPIServer, key_file: str, apps: list[SchedulerApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    settings = cluster.config(kube_api, key_file, lease_s=2.0)
    first = cluster.start(settings, identity="a")
    apps.append(first)
    standby = cluster.start(settings, identity="b")
    apps.append(standby)
    assert first.is_leader() and not standby.is_leader()
    assert standby.service is not None
    relists: list[Backend] = []
    resync = standby.service.resync

    def counted(backend: Backend) -> None:
        relists.append(backend)
        resync(backend)

    monkeypatch.setattr(standby.service, "resync", counted)

    first.stop(1.0)  # hands the lease back: the standby takes over at its next try

    cluster.eventually(standby.is_leader, what="the standby to lead")
    cluster.eventually(lambda: len(relists) == 1, what="the new leader's fresh listing")
