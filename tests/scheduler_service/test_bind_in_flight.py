"""A bind that is still running (or whose outcome is unknown) pins its pod to its node.

kube-scheduler gives an extender bind `httpTimeout` (5 s as deployed); past it, it retries the pod,
perhaps on another node, while the first bind may still land. Moving the pod's reservation then
would free a GPU the first Binding takes, for a third pod to be given too.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler_plugin import binder
from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.errors import BindFailed, Conflict, KubeAPIError, Unavailable, Unschedulable
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import gpu_node, whole_pod
from tests.scheduler_service.conftest import KEY

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class HeldBackend(EmbeddedBackend):
    """The embedded backend, whose next bind waits until the test lets it go, or whose answer gets lost."""

    def __init__(self, *, path: str) -> None:
        super().__init__(path=path)
        self.entered = threading.Event()
        self.go = threading.Event()
        self.go.set()
        self.lost_answers = 0

    def hold_next_bind(self) -> None:
        self.go.clear()

    def bind(self, *, pod: Mapping[str, Any], node: NodeName, annotations: Mapping[str, str]) -> None:
        held = not self.go.is_set()
        if held:
            self.entered.set()
            assert self.go.wait(10)
        super().bind(pod=pod, node=node, annotations=annotations)
        if self.lost_answers:
            self.lost_answers -= 1
            raise Unavailable("connection reset after the request was sent")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[HeldBackend]:
    held = HeldBackend(path=str(tmp_path / "state.db"))
    yield held
    held.go.set()
    held.stop()


@pytest.fixture
def service(backend: HeldBackend, clock: FakeClock) -> SchedulingService:
    built = SchedulingService(core_factory=lambda: Scheduler(assume_ttl_s=30, clock=clock), backend=backend, signing_key=KEY)
    backend.start(built)
    for name in ("n1", "n2"):
        built.report_devices(gpu_node(name, gpus=1))
    return built


def _gpus_used(service: SchedulingService, node: str) -> int:
    (view,) = service.node_views([node])
    return sum(len(g.pods) for g in view.gpus)


def test_while_a_bind_runs_the_pod_is_neither_bound_nor_reserved_elsewhere_and_its_gpu_is_not_given_twice(
    service: SchedulingService, backend: HeldBackend
) -> None:
    p, q = whole_pod("p"), whole_pod("q")
    backend.hold_next_bind()
    first: list[object] = []
    binding = threading.Thread(target=lambda: first.append(service.bind(p, "n1")))
    binding.start()
    assert backend.entered.wait(5)

    # kube-scheduler gave up on the answer and retries p on n2; then it tries q where p is landing.
    with pytest.raises(Conflict, match=r"being bound to node n1 right now.*retry"):
        service.bind(p, "n2")
    with pytest.raises(Conflict, match="being bound to node n1"):
        service.reserve(p, "n2")
    with pytest.raises(Unschedulable):
        service.reserve(q, "n1")

    backend.go.set()
    binding.join(5)
    assert first and service.allocation_of(p["metadata"]["uid"]) is not None
    assert service.allocation_of(p["metadata"]["uid"])[0] == "n1"  # type: ignore[index]
    assert service.bind(q, "n2").node == "n2"
    assert (_gpus_used(service, "n1"), _gpus_used(service, "n2")) == (1, 1)


def test_a_retry_on_the_same_node_while_the_bind_runs_is_allowed(service: SchedulingService, backend: HeldBackend) -> None:
    p = whole_pod("p")
    backend.hold_next_bind()
    binding = threading.Thread(target=lambda: service.bind(p, "n1"))
    binding.start()
    assert backend.entered.wait(5)

    assert service.reserve(p, "n1").node == "n1"

    backend.go.set()
    binding.join(5)
    with pytest.raises(Conflict, match="bound to node n1 already"):
        service.reserve(p, "n2")


def test_after_a_bind_whose_outcome_is_unknown_the_pod_stays_on_its_node_until_its_reservation_expires(
    service: SchedulingService, backend: HeldBackend, clock: FakeClock
) -> None:
    p, q = whole_pod("p"), whole_pod("q")
    backend.lost_answers = 1  # the bind happened; the caller hears Unavailable
    with pytest.raises(Unavailable):
        service.bind(p, "n1")

    with pytest.raises(Conflict, match="not known yet"):
        service.reserve(p, "n2")
    with pytest.raises(Unschedulable):
        service.reserve(q, "n1")
    assert service.bind(p, "n1").node == "n1"  # the retry where it was: settled

    clock.now += 60
    service.tick(refresh_gauges=False)
    assert _gpus_used(service, "n1") == 1


class HungKube:
    """An API server that lets every request run its whole timeout, then fails it; `conflicts` answers 409 instead."""

    def __init__(self, clock: FakeClock, pod: dict[str, Any], *, conflicts: bool = False) -> None:
        self.clock = clock
        self.pod = pod
        self.conflicts = conflicts
        self.calls: list[tuple[str, float]] = []

    def bind_pod(self, *, timeout_s: float, **_: Any) -> None:
        self.calls.append(("bind", timeout_s))
        if self.conflicts:
            self.clock.now += min(timeout_s, 1.0)
            raise KubeAPIError("Kubernetes API: 409 Conflict the object has been modified", status=409)
        self.clock.now += timeout_s
        raise KubeAPIError("Kubernetes API unreachable: read timed out")

    def get_pod(self, *, namespace: str, name: str, timeout_s: float | None = None) -> dict[str, Any]:
        assert timeout_s is not None
        self.calls.append(("get", timeout_s))
        if self.conflicts:
            self.clock.now += min(timeout_s, 1.0)
            return self.pod
        self.clock.now += timeout_s
        raise KubeAPIError("Kubernetes API unreachable: read timed out")


@pytest.mark.parametrize(("conflicts", "outcome"), [(False, Unavailable), (True, BindFailed)])
def test_a_bind_takes_at_most_its_time_limit_whatever_the_api_server_does(conflicts: bool, outcome: type[Exception]) -> None:
    clock = FakeClock()
    pod = whole_pod("p")
    kube = HungKube(clock, pod, conflicts=conflicts)
    started = clock.now

    with pytest.raises(outcome):
        binder.bind(kube, pod=pod, node="n1", annotations={}, clock=clock)  # type: ignore[arg-type]

    assert clock.now - started <= binder.BIND_TIMEOUT_S
    assert all(0 < limit <= binder.BIND_TIMEOUT_S for _, limit in kube.calls)
    assert kube.calls[-1][0] == "get"  # time was kept to read the pod back


def test_the_bind_time_limit_fits_inside_kube_schedulers_extender_http_timeout() -> None:
    for path in ("hack/deploy/20-kube-scheduler-config.yaml", "deploy/chart/templates/20-kube-scheduler-config.yaml"):
        text = (REPO / path).read_text()
        found = re.search(r"^\s*httpTimeout:\s*(\d+(?:\.\d+)?)s\s*$", text, re.MULTILINE)
        assert found, f"{path}: no extender httpTimeout"
        # A second for the request's wait for a worker, the reserve and the signing.
        assert float(found[1]) >= binder.BIND_TIMEOUT_S + 1.0, path
    document = yaml.safe_load((REPO / "hack/deploy/20-kube-scheduler-config.yaml").read_text())
    (extender,) = yaml.safe_load(document["data"]["config.yaml"])["extenders"]
    assert extender["httpTimeout"] == "5s"
