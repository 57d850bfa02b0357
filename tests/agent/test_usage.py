"""The usage cycle: NVML numbers per GPU and processes mapped to pods."""

from __future__ import annotations

import os

from agent.cgroups import PidResolver
from agent.discovery import discover
from agent.fakenvml_inventory import ProcessSpec
from agent.pcitopology import InventoryTopology
from agent.usage import UsageSampler, targets_from
from tests.agent.helpers import A100_MIG, T4, read_data, started_fake

POD = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"  # the pod of cgroup/v2-systemd


def _proc(root: str, pid: int, sample: str) -> None:
    os.makedirs(os.path.join(root, str(pid)), exist_ok=True)
    with open(os.path.join(root, str(pid), "cgroup"), "w") as f:
        f.write(read_data("cgroup", sample))


def test_a_cycle_reports_utilization_memory_and_pod_of_each_process(tmp_path: object) -> None:
    root = str(tmp_path)
    _proc(root, 41230, "v2-systemd")
    _proc(root, 41231, "v2-systemd")
    _proc(root, 1999, "host-process")
    nvml, inventory = started_fake(T4)
    found = discover(nvml, node_name="n", topology=InventoryTopology(inventory))
    usage = UsageSampler(nvml, resolver=PidResolver(proc_root=root)).sample(
        targets_from(found.handles, gpus=found.devices.gpus)
    )
    by_uuid = {u.uuid: u for u in usage}
    gpu0 = by_uuid[inventory.gpus[0].uuid]
    assert (gpu0.sm_utilization_percent, gpu0.memory_used_bytes) == (63, 6 * 2**30)
    assert [(p.pid, p.pod_uid, p.used_memory_bytes) for p in gpu0.processes] == [
        (41230, POD, 4 * 2**30),
        (41231, POD, 2 * 2**30),
    ]
    gpu2 = by_uuid[inventory.gpus[2].uuid]
    assert [(p.pid, p.pod_uid) for p in gpu2.processes] == [(1999, "")]
    assert not any(u.error for u in usage)


def test_a_lost_gpu_comes_back_with_an_error_and_the_others_still_sampled() -> None:
    nvml, inventory = started_fake(T4)
    found = discover(nvml, node_name="n", topology=InventoryTopology(inventory))
    nvml.set_lost(1, True)
    usage = UsageSampler(nvml, resolver=PidResolver(proc_root="/nonexistent")).sample(
        targets_from(found.handles, gpus=found.devices.gpus)
    )
    assert [bool(u.error) for u in usage] == [False, True, False, False]
    assert "GpuIsLost" in usage[1].error


def test_mig_instances_get_their_own_entries_from_the_parent_process_list() -> None:
    nvml, inventory = started_fake(A100_MIG)
    found = discover(nvml, node_name="n", topology=InventoryTopology(inventory))
    parent = found.devices.gpus[1]
    nvml.set_usage(1, processes=(ProcessSpec(pid=7, used_memory_bytes=2**30, gpu_instance_id=3),))
    usage = UsageSampler(nvml, resolver=PidResolver(proc_root="/nonexistent")).sample(
        targets_from(found.handles, gpus=found.devices.gpus)
    )
    by_uuid = {u.uuid: u for u in usage}
    two_g = parent.mig_instances[1]  # gpu instance 3
    assert [p.pid for p in by_uuid[two_g.uuid].processes] == [7]
    assert by_uuid[two_g.uuid].memory_used_bytes == 2**30
    assert by_uuid[parent.mig_instances[0].uuid].processes == ()
    # MIG mode has no utilization counters; that is not an error.
    assert by_uuid[parent.uuid].sm_utilization_percent == 0 and not by_uuid[parent.uuid].error


def test_each_process_cgroup_is_read_once_across_cycles(tmp_path: object) -> None:
    root = str(tmp_path)
    for pid in (41230, 41231, 1999):
        _proc(root, pid, "v2-systemd")
    nvml, inventory = started_fake(T4)
    found = discover(nvml, node_name="n", topology=InventoryTopology(inventory))
    resolver = PidResolver(proc_root=root)
    sampler = UsageSampler(nvml, resolver=resolver)
    targets = targets_from(found.handles, gpus=found.devices.gpus)
    for _ in range(5):
        sampler.sample(targets)
    assert resolver.reads == 3
