"""The node's hook and the scheduler count the same memory for a share: `apis.allocation.share_memory_bytes`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.hook import decide, holds_of
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, share_memory_bytes
from apis.devices import NodeDevices
from scheduler_plugin.core.api import NodeName, PodRequest, PodUID
from scheduler_plugin.core.records import NodeRecord, PodRecord
from tests.agent.helpers import T4
from tests.agent.test_hook import _devices, _request, _settings, _signed

PERCENT = st.integers(min_value=0, max_value=100)


def scheduler_counts(share: GPUShare, devices: NodeDevices) -> int:
    record = NodeRecord(name=NodeName(devices.node_name))
    record.set_devices(devices)
    request = PodRequest(uid=PodUID("p"), namespace="ns", name="p", device=None)
    record.pods[request.uid] = PodRecord(request=request, node=record.name, allocation=Allocation((share,)), assumed=False)
    slot = record.slot_by_uuid[share.uuid]
    return record.gpu_usage()[1][slot]


@given(core=PERCENT, memory=st.integers(min_value=0, max_value=2**36), ratio=PERCENT)
def test_the_hook_and_the_scheduler_count_the_same_memory_for_any_share(core: int, memory: int, ratio: int) -> None:
    devices = _devices(T4)
    gpu = devices.gpus[0]
    share = GPUShare(gpu.minor, gpu.uuid, core, memory, ratio)

    (hold,) = holds_of(Allocation((share,)), devices)

    assert hold.memory_bytes == scheduler_counts(share, devices) == share_memory_bytes(
        share, gpu_memory_bytes=gpu.memory_bytes
    )


def test_a_whole_gpu_with_neither_bytes_nor_a_ratio_is_admitted_with_all_its_memory_and_counted_so() -> None:
    devices = _devices(T4)
    gpu = devices.gpus[0]
    share = GPUShare(gpu.minor, gpu.uuid, 100, 0, 0, containers=(ContainerShare("main", 100, 0, 0),))

    decision = decide(_request(_signed(share)), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE))

    assert decision.edits is not None and not decision.rejection
    assert dict(decision.edits.envs)[names.FGPU_MEMORY_BYTES] == str(gpu.memory_bytes)
    assert [h.memory_bytes for h in decision.holds] == [gpu.memory_bytes]
    assert scheduler_counts(share, devices) == gpu.memory_bytes
