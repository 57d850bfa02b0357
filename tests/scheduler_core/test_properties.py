"""Property: whatever happens, no GPU is ever given beyond its capacity.

A hypothesis state machine drives the core alone through random sequences of
reserve, bind, unreserve, delete, expiry, device changes (GPUs appearing,
vanishing, turning unhealthy, held outside fgpu, MIG instances) and node
removal, and checks after every step that

* no regular GPU has more than 100% core or its memory allocated by pods that
  reserve placed (the pods the core itself decided on);
* no MIG instance is held by two pods;
* the arrays filter reads agree with the records (free = capacity - allocated);
* a core rebuilt from the same devices and bound pods has the same views.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from apis.devices import NodeDevices
from apis.request import DeviceRequest
from scheduler_plugin.core.api import NodeName, PodRequest, PodUID, SchedulingError
from scheduler_plugin.core.demand import FULL_PERCENT
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import gpu, node, pod, share, whole

NODES = ("n0", "n1", "n2")

requests = st.one_of(
    st.builds(
        lambda core, gib, cards: share(core, gib=gib, cards=cards),
        st.sampled_from([0, 10, 25, 50, 100]),
        st.sampled_from([1, 5, 10, 20, 40]),
        st.integers(1, 2),
    ),
    st.builds(
        lambda core, ratio: share(core, ratio=ratio),
        st.sampled_from([10, 30, 50]),
        st.sampled_from([10, 25, 50, 100]),
    ),
    st.builds(whole, st.integers(1, 4)),
)


@st.composite
def device_reports(draw: st.DrawFn, name: str) -> NodeDevices:
    count = draw(st.integers(0, 4))
    unhealthy = draw(st.sets(st.integers(0, 3)))
    external = draw(st.sets(st.integers(0, 3), max_size=1))
    mig_gpu = draw(st.sampled_from([None, 0, 1]))
    gpus = [
        gpu(
            name,
            i,
            memory_gib=40,
            healthy=i not in unhealthy,
            mig=[("1g.10gb", 10), ("2g.20gb", 20)] if i == mig_gpu else (),
        )
        for i in range(count)
    ]
    return node(name, gpus=gpus, external=[i for i in external if i < count])


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.core = Scheduler(assume_ttl_s=10, clock=lambda: self.now)
        self.devices: dict[str, NodeDevices] = {}
        self.requests: dict[PodUID, PodRequest] = {}
        self.bound: dict[PodUID, NodeName] = {}
        self.serial = 0
        for name in NODES:
            self.devices[name] = node(name, 4, memory_gib=40)
            self.core.upsert_node_devices(self.devices[name])

    @rule(device=requests, pick=st.sampled_from([None, *NODES]))
    def reserve(self, device: DeviceRequest, pick: str | None) -> None:
        self.serial += 1
        request = pod(f"p{self.serial}", device)
        target = self.core.select(request) if pick is None else NodeName(pick)
        if target is None:
            return
        try:
            self.core.reserve(request, target)
        except SchedulingError:
            return
        self.requests[request.uid] = request

    @rule(data=st.data())
    def bind(self, data: st.DataObject) -> None:
        assumed = [uid for uid in self.requests if self.core.is_assumed(uid)]
        if not assumed:
            return
        uid = data.draw(st.sampled_from(sorted(assumed)))
        placed = self.core.allocation_of(uid)
        assert placed is not None
        node_name, allocation = placed
        if data.draw(st.booleans()):
            self.core.confirm(uid)
        self.core.add_pod(self.requests[uid], node_name, allocation)  # the informer sees it bound
        self.bound[uid] = node_name

    @rule(data=st.data())
    def unreserve_or_delete(self, data: st.DataObject) -> None:
        if not self.requests:
            return
        uid = data.draw(st.sampled_from(sorted(self.requests)))
        if data.draw(st.booleans()):
            self.core.unreserve(uid)
            if uid not in self.bound:
                self.requests.pop(uid)
        else:
            self.core.remove_pod(uid)
            self.requests.pop(uid)
            self.bound.pop(uid, None)

    @rule(seconds=st.sampled_from([1.0, 5.0, 11.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        for uid in self.core.expire_assumed():
            assert uid not in self.bound
            self.requests.pop(uid)

    @rule(data=st.data(), name=st.sampled_from(NODES))
    def devices_change(self, data: st.DataObject, name: str) -> None:
        self.devices[name] = data.draw(device_reports(name))
        self.core.upsert_node_devices(self.devices[name])

    @rule(name=st.sampled_from(NODES))
    def node_goes_and_comes_back(self, name: str) -> None:
        self.core.remove_node(NodeName(name))
        self.core.upsert_node_devices(self.devices[name])

    @invariant()
    def no_gpu_beyond_capacity(self) -> None:
        held_migs: set[str] = set()
        for view in self.core.node_views():
            for g in view.gpus:
                if g.device.mig_enabled:
                    continue
                assert g.allocated_core_percent <= FULL_PERCENT, (view.name, g)
                assert g.allocated_memory_bytes <= g.device.memory_bytes, (view.name, g)
        for uid in self.requests:
            placed = self.core.allocation_of(uid)
            assert placed is not None
            for share_ in placed[1].gpus:
                if share_.mig_uuid:
                    assert share_.mig_uuid not in held_migs
                    held_migs.add(share_.mig_uuid)

    @invariant()
    def arrays_agree_with_records(self) -> None:
        state = self.core.state
        for view in self.core.node_views():
            slot = state.slot_of[view.name]
            for column, g in enumerate(view.gpus):
                if state.gpu_usable[slot, column]:
                    assert state.core_free[slot, column] == FULL_PERCENT - g.allocated_core_percent
                    assert state.mem_free[slot, column] == g.device.memory_bytes - g.allocated_memory_bytes
                    entirely_free = g.allocated_core_percent == 0 and g.allocated_memory_bytes == 0
                    assert state.gpu_whole_free[slot, column] == entirely_free
                else:
                    assert state.core_free[slot, column] == 0
                    assert not state.gpu_whole_free[slot, column]

    @invariant()
    def a_rebuilt_core_sees_the_same_bound_state(self) -> None:
        rebuilt = Scheduler()
        for devices in self.devices.values():
            rebuilt.upsert_node_devices(devices)
        for uid, node_name in self.bound.items():
            placed = self.core.allocation_of(uid)
            assert placed is not None
            rebuilt.add_pod(self.requests[uid], node_name, placed[1])

        def bound_view(core: Scheduler) -> list[object]:
            return [
                (v.name, [(g.device.uuid, [p.uid for p in g.pods if not p.assumed]) for g in v.gpus])
                for v in core.node_views()
            ]

        assert bound_view(rebuilt) == bound_view(self.core)


CoreMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_core_never_allocates_beyond_capacity = CoreMachine.TestCase
