"""Random schedule / delete / device change / restart sequences on the embedded backend.

After every step no GPU is allocated beyond its capacity; after a restart the
bound state equals the bound state before it. (A reservation in flight is
deliberately not durable: it is assumed, and a restarted scheduler has no
bind coming for it.)
"""

from __future__ import annotations

import contextlib
import itertools
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from scheduler_plugin.backend_embedded import EmbeddedBackend
from scheduler_plugin.core.scheduler import Scheduler
from scheduler_plugin.errors import ServiceError
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import gpu_node, share_pod, whole_pod
from tests.scheduler_service.conftest import KEY
from tests.scheduler_service.views import State, over_capacity, state_of

NODES = ("n1", "n2", "n3")
_names = itertools.count()


def bound_only(state: State) -> State:
    return {
        node: {uuid: _without_assumed(entry) for uuid, entry in gpus.items()} for node, gpus in state.items()
    }


def _without_assumed(entry: tuple[int, int, tuple[tuple[str, int, int, bool], ...]]) -> tuple[int, int, tuple[tuple[str, int, int, bool], ...]]:
    _, _, shares = entry
    kept = tuple(s for s in shares if not s[3])
    return (sum(s[1] for s in kept), sum(s[2] for s in kept), kept)


class SchedulerLifecycle(RuleBasedStateMachine):
    @initialize()
    def open(self) -> None:
        self._dir = tempfile.TemporaryDirectory()
        self.db = str(Path(self._dir.name) / "state.db")
        self.backend: EmbeddedBackend | None = None
        self.service = self._start()
        self.bound: list[dict[str, object]] = []
        for name in NODES:
            self.service.report_devices(gpu_node(name, gpus=2, memory_gib=40))

    def _start(self) -> SchedulingService:
        if self.backend is not None:
            self.backend.stop()
        self.backend = EmbeddedBackend(path=self.db)
        service = SchedulingService(core_factory=Scheduler, backend=self.backend, signing_key=KEY)
        self.backend.start(service)
        return service

    @rule(core=st.sampled_from([10, 25, 50, 70, 100]), memory_gib=st.integers(1, 40))
    def schedule_share(self, core: int, memory_gib: int) -> None:
        pod = share_pod(f"s{next(_names)}", core=core, memory=f"{memory_gib}Gi")
        try:
            if self.service.schedule(pod) is not None:
                self.bound.append(pod)
        except ServiceError:
            pass

    @rule(gpus=st.integers(1, 2))
    def schedule_whole(self, gpus: int) -> None:
        pod = whole_pod(f"w{next(_names)}", gpus=gpus)
        try:
            if self.service.schedule(pod) is not None:
                self.bound.append(pod)
        except ServiceError:
            pass

    @rule(node=st.sampled_from(NODES), core=st.sampled_from([30, 100]))
    def reserve_without_bind(self, node: str, core: int) -> None:
        with contextlib.suppress(ServiceError):
            self.service.reserve(share_pod(f"r{next(_names)}", core=core, memory="1Gi"), node)

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        if not self.bound:
            return
        pod = self.bound.pop(data.draw(st.integers(0, len(self.bound) - 1)))
        self.service.unreserve(pod)

    @rule(node=st.sampled_from(NODES), gpus=st.integers(0, 3), unhealthy=st.sets(st.integers(0, 2), max_size=1))
    def device_change(self, node: str, gpus: int, unhealthy: set[int]) -> None:
        self.service.report_devices(gpu_node(node, gpus=gpus, memory_gib=40, unhealthy=tuple(unhealthy)))

    @rule()
    def restart(self) -> None:
        before = bound_only(state_of(self.service))
        self.service = self._start()
        assert bound_only(state_of(self.service)) == before

    @invariant()
    def no_gpu_over_capacity(self) -> None:
        if hasattr(self, "service"):
            assert over_capacity(self.service) == []

    def teardown(self) -> None:
        if getattr(self, "backend", None) is not None:
            assert self.backend is not None
            self.backend.stop()
        if hasattr(self, "_dir"):
            self._dir.cleanup()


SchedulerLifecycle.TestCase.settings = settings(
    max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_random_lifecycles_never_overallocate_and_restarts_keep_state = SchedulerLifecycle.TestCase
