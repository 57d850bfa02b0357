"""Binds that race with expiry, resync and lost answers: the GPU is counted once, on the node the pod is bound to."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.api import NodeName
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.errors import Conflict, Unavailable
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import gpu_node, whole_pod
from tests.scheduler_service.conftest import KEY


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RacingBackend(EmbeddedBackend):
    """The embedded backend, with a hook run just before a bind and answers that can be lost after one."""

    def __init__(self, *, path: str) -> None:
        super().__init__(path=path)
        self.before_bind: Callable[[], None] = lambda: None
        #: binds still to come whose answer is lost (the bind happens, the caller hears Unavailable)
        self.lost_answers = 0

    def bind(self, *, pod: Mapping[str, Any], node: NodeName, annotations: Mapping[str, str]) -> None:
        self.before_bind()
        super().bind(pod=pod, node=node, annotations=annotations)
        if self.lost_answers:
            self.lost_answers -= 1
            raise Unavailable("connection reset after the request was sent")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[RacingBackend]:
    racing = RacingBackend(path=str(tmp_path / "state.db"))
    yield racing
    racing.stop()


@pytest.fixture
def service(backend: RacingBackend, clock: FakeClock) -> SchedulingService:
    built = SchedulingService(
        core_factory=lambda: Scheduler(assume_ttl_s=30, clock=clock), backend=backend, signing_key=KEY
    )
    backend.start(built)
    for name in ("n1", "n2"):
        built.report_devices(gpu_node(name, gpus=1))
    return built


def _holder(service: SchedulingService, uid: str) -> tuple[str, tuple[str, ...]] | None:
    held = service.allocation_of(uid)
    return None if held is None else (held[0], held[1].uuids)


def _uid(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


def test_a_bind_that_succeeds_after_its_reservation_expired_still_counts_the_pod(
    service: SchedulingService, backend: RacingBackend, clock: FakeClock
) -> None:
    def expire() -> None:
        clock.now += 60
        service.tick(refresh_gauges=False)

    backend.before_bind = expire
    pod = whole_pod("slow")
    service.bind(pod, "n1")

    assert _holder(service, _uid(pod)) == ("n1", ("GPU-n1-00",))
    assert not service.filter(whole_pod("next"), ["n1"]).verdicts[0].feasible


def test_a_bind_that_succeeds_across_a_resync_still_counts_the_pod(
    service: SchedulingService, backend: RacingBackend
) -> None:
    backend.before_bind = lambda: service.resync(backend)
    pod = whole_pod("slow")
    service.bind(pod, "n1")

    assert _holder(service, _uid(pod)) == ("n1", ("GPU-n1-00",))
    assert not service.filter(whole_pod("next"), ["n1"]).verdicts[0].feasible


def test_a_retry_after_a_lost_bind_answer_keeps_the_pod_on_its_first_node(
    service: SchedulingService, backend: RacingBackend, clock: FakeClock
) -> None:
    pod = whole_pod("retried")
    backend.lost_answers = 1
    with pytest.raises(Unavailable):
        service.schedule(pod)
    first = _holder(service, _uid(pod))
    assert first is not None

    signed = service.schedule(pod)

    assert signed is not None and signed.node == first[0]
    # Counted as bound now: it outlives the reservation's TTL, and the other node stays free.
    clock.now += 60
    service.tick(refresh_gauges=False)
    assert _holder(service, _uid(pod)) == first
    other = "n2" if first[0] == "n1" else "n1"
    assert service.filter(whole_pod("next"), [other]).verdicts[0].feasible
    assert not service.filter(whole_pod("next"), [first[0]]).verdicts[0].feasible


def test_a_bind_conflict_counts_the_pod_on_the_node_it_is_bound_to(
    service: SchedulingService, backend: RacingBackend, clock: FakeClock
) -> None:
    pod = whole_pod("moved")
    backend.lost_answers = 1
    with pytest.raises(Unavailable):
        service.bind(pod, "n1")
    # The answer never came and the reservation ran out: the core forgot the pod bound on n1.
    clock.now += 60
    service.tick(refresh_gauges=False)
    assert service.allocation_of(_uid(pod)) is None

    with pytest.raises(Conflict, match="n1"):
        service.bind(pod, "n2")

    assert _holder(service, _uid(pod)) == ("n1", ("GPU-n1-00",))
    assert not service.filter(whole_pod("next"), ["n1"]).verdicts[0].feasible
    assert service.filter(whole_pod("next"), ["n2"]).verdicts[0].feasible
