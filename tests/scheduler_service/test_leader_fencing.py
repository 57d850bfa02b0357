"""A deposed leader writes nothing, and a pod is bound only together with its own node's allocation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from apis import names
from apis.allocation import decode_allocation
from scheduler_plugin import binder
from scheduler_plugin.backend_kubernetes import KubernetesBackend
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.errors import KubeAPIError, NotLeader
from scheduler_plugin.kube import Kube
from scheduler_plugin.leader import LeaderElector
from scheduler_plugin.scheduling import SchedulingService
from tests.kubeapi.server import KubeAPIServer
from tests.scheduler_service import cluster
from tests.scheduler_service.builders import gpu_node, whole_pod
from tests.scheduler_service.conftest import KEY


class InterruptedKube(Kube):
    """A Kube that runs `before_write` before its next pod write, `before_binding` before its next Binding
    (the process stalls there, or another writer cuts in)."""

    before_write: Callable[[], None] | None = None
    before_binding: Callable[[], None] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: (resourceVersion the Binding carried, HTTP status it got), in order
        self.bindings: list[tuple[str, int]] = []

    def patch_pod_metadata(self, **kwargs: Any) -> dict[str, Any]:
        self._interrupt(binding=False)
        return super().patch_pod_metadata(**kwargs)

    def bind_pod(self, **kwargs: Any) -> None:
        self._interrupt(binding=True)
        try:
            super().bind_pod(**kwargs)
        except KubeAPIError as exc:
            self.bindings.append((kwargs.get("resource_version", ""), exc.status))
            raise
        self.bindings.append((kwargs.get("resource_version", ""), 201))

    def _interrupt(self, *, binding: bool) -> None:
        run, self.before_write = self.before_write, None
        if binding:
            run, self.before_binding = run or self.before_binding, None
        if run is not None:
            run()


@dataclass
class Instance:
    kube: InterruptedKube
    elector: LeaderElector
    backend: KubernetesBackend
    service: SchedulingService


@pytest.fixture
def instances(kube_api: KubeAPIServer) -> Iterator[Callable[[str, list[float]], Instance]]:
    """Schedulers on the API double whose elections run only when the test says (`campaign`), on its clock."""
    started: list[Instance] = []

    def start(identity: str, now: list[float]) -> Instance:
        kube = InterruptedKube.connect(kubeconfig=kube_api.kubeconfig_path)
        assert isinstance(kube, InterruptedKube)
        elector = LeaderElector(
            kube=kube, namespace="kube-system", name="fgpu-scheduler", identity=identity,
            lease_duration_s=10.0, renew_deadline_s=6.0, retry_period_s=3600.0, clock=lambda: now[0],
        )
        backend = KubernetesBackend(kube, watch_timeout_s=5)
        service = SchedulingService(core_factory=Scheduler, backend=backend, signing_key=KEY, is_leader=elector.is_leader)
        backend.start(service)
        elector.start()
        started.append(Instance(kube, elector, backend, service))
        return started[-1]

    yield start
    for instance in started:
        instance.elector.stop(release=False)
        instance.backend.stop()
        instance.kube.close()


def _placed(api: KubeAPIServer, name: str) -> tuple[str, str, tuple[str, ...]]:
    """(node it is bound to, node its allocation is for, GPUs of its allocation)."""
    stored = cluster.get_pod(api, name)
    annotations = stored["metadata"].get("annotations") or {}
    allocation = decode_allocation(annotations[names.DEVICE_ALLOCATED])
    return stored["spec"].get("nodeName", ""), annotations.get(names.ALLOCATION_NODE, ""), allocation.uuids


def test_a_leader_paused_past_its_lease_writes_nothing_on_resuming_and_each_pod_is_bound_once_with_its_own_nodes_gpu(
    kube_api: KubeAPIServer, instances: Callable[[str, list[float]], Instance]
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    cluster.add_node(kube_api, gpu_node("n2", gpus=1))
    p = cluster.add_pod(kube_api, whole_pod("p"))
    q = cluster.add_pod(kube_api, whole_pod("q"))
    now = [0.0]
    a = instances("a", now)
    b = instances("b", now)
    assert a.elector.is_leader() and not b.elector.is_leader()

    def paused() -> None:
        # `a` stalls after deciding to put p on n1's only GPU; its lease runs out, b takes over and gives that GPU to q.
        now[0] = 11.0
        b.elector.campaign()
        assert b.elector.is_leader()
        b.service.bind(q, "n1")

    a.kube.before_write = paused
    with pytest.raises(NotLeader, match="does not hold lease"):
        a.service.bind(p, "n1")
    b.service.bind(cluster.get_pod(kube_api, "p"), "n2")

    assert _placed(kube_api, "q") == ("n1", "n1", ("GPU-n1-00",))
    assert _placed(kube_api, "p") == ("n2", "n2", ("GPU-n2-00",))
    held = a.service.allocation_of(p["metadata"]["uid"])  # the deposed leader's reservation on n1 is gone
    assert held is None or held[0] == "n2"


def test_the_allocation_travels_in_the_binding_so_a_pod_never_carries_another_nodes_allocation(
    kube_api: KubeAPIServer, instances: Callable[[str, list[float]], Instance]
) -> None:
    cluster.install(kube_api)
    cluster.add_node(kube_api, gpu_node("n1", gpus=1))
    cluster.add_node(kube_api, gpu_node("n2", gpus=1))
    p = cluster.add_pod(kube_api, whole_pod("p"))
    a = instances("a", [0.0])
    foreign = {
        names.DEVICE_ALLOCATED: '{"gpu":[{"id":"GPU-n2-00","minor":0,"resources":{"koordinator.sh/gpu-core":"100"}}]}',
        names.ALLOCATION_NODE: "n2",
        names.ALLOCATION_SIGNATURE: "v1:" + "0" * 64,
    }

    def another_writer() -> None:  # e.g. a second scheduler annotating the pod for n2 just before our Binding
        cut_in = cluster.get_pod(kube_api, "p")
        cut_in["metadata"]["annotations"] = {**(cut_in["metadata"].get("annotations") or {}), **foreign}
        kube_api.put_object("/api/v1/namespaces/default/pods", cut_in)

    a.kube.before_binding = another_writer
    a.service.bind(p, "n1")

    assert _placed(kube_api, "p") == ("n1", "n1", ("GPU-n1-00",))
    # The first Binding carried the version read before the other writer: 409, then the pod was read
    # again and bound at its new version, our annotations replacing the foreign ones in that write.
    (first_rv, first), (second_rv, second) = a.kube.bindings
    assert (first_rv, first, second) == (p["metadata"]["resourceVersion"], 409, 201)
    assert int(second_rv) > int(first_rv)


class RecordingKube:
    """The part of Kube the binder uses: the first Binding meets a pod that changed since it was read."""

    def __init__(self, fresh: dict[str, Any]) -> None:
        self.fresh = fresh
        self.bindings: list[dict[str, Any]] = []

    def bind_pod(self, **kwargs: Any) -> None:
        self.bindings.append(kwargs)
        if len(self.bindings) == 1:
            raise KubeAPIError("Kubernetes API: 409 Conflict the object has been modified", status=409, reason="Conflict")

    def get_pod(self, *, namespace: str, name: str, timeout_s: float | None = None) -> dict[str, Any]:
        return self.fresh


def test_the_binding_carries_uid_resource_version_and_annotations_and_is_retried_on_the_changed_pod() -> None:
    read = whole_pod("p")
    read["metadata"]["resourceVersion"] = "7"
    fresh = {**read, "metadata": {**read["metadata"], "resourceVersion": "8"}}
    kube = RecordingKube(fresh)
    ours = {names.DEVICE_ALLOCATED: "{}", names.ALLOCATION_NODE: "n1", names.ALLOCATION_SIGNATURE: "sig"}

    binder.bind(kube, pod=read, node="n1", annotations=ours)  # type: ignore[arg-type]

    assert [(b["uid"], b["resource_version"], b["node"], b["annotations"]) for b in kube.bindings] == [
        (read["metadata"]["uid"], "7", "n1", ours),
        (read["metadata"]["uid"], "8", "n1", ours),
    ]
