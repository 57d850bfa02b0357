"""Per container: only the containers that asked see GPUs, each with its own part, and nothing the pod
author wrote in the env decides a limit."""

from __future__ import annotations

import os
import stat

import pytest

from agent.hook import NO_ANSWER, HookRequest, decide
from agent.hookserver import make_shared_dir
from apis import names
from apis.allocation import Allocation, ContainerShare, GPUShare, encode_allocation
from apis.signing import allocation_annotations
from tests.agent.test_hook import KEY, NODE, POD_UID, GiB, _devices, _settings

POD_ENV = {
    names.HAMI_DISABLE_CONTROL: "true",
    "CUDA_DEVICE_MEMORY_LIMIT_0": "999999m",
    "CUDA_DEVICE_MEMORY_LIMIT_3": "999999m",
    names.HAMI_MEMORY_LIMIT: "999999m",
    names.HAMI_SM_LIMIT: "100",
    names.HAMI_OVERSUBSCRIBE: "true",
    names.HAMI_CORE_POLICY: "disable",
    names.HAMI_SHARED_CACHE: "/tmp/x",
    names.MPS_ACTIVE_THREAD_PERCENTAGE: "100",
    names.MPS_PINNED_MEM_LIMIT: "0=999999M",
    "CUDA_MPS_CLIENT_PRIORITY": "0",
    "HOME": "/root",
}


def _two_container_share(core_a: int = 30, core_b: int = 20) -> GPUShare:
    gpu = _devices().gpus[0]
    parts = (ContainerShare("a", core_a, core_a * GiB // 10, core_a), ContainerShare("b", core_b, core_b * GiB // 10, core_b))
    total = core_a + core_b
    return GPUShare(gpu.minor, gpu.uuid, total, total * GiB // 10, total, containers=parts)


def _request(container: str, *shares: GPUShare, env: tuple[str, ...] = ()) -> HookRequest:
    annotations = allocation_annotations(KEY, pod_uid=POD_UID, node_name=NODE, allocation=Allocation(gpus=shares))
    return HookRequest(
        pod_uid=POD_UID, pod_namespace="ml", pod_name="p", container_name=container, annotations=annotations, env_names=env
    )


def test_each_container_sees_only_its_own_part_of_the_pods_share() -> None:
    share = _two_container_share()
    for name, core in (("a", 30), ("b", 20)):
        decision = decide(_request(name, share), devices=_devices(), settings=_settings(names.ISOLATION_HAMI_CORE))
        assert decision.edits is not None, decision.rejection
        env = dict(decision.edits.envs)
        assert env[names.FGPU_CORE_PERCENT] == str(core)
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{core * GiB // 10 // 2**20}m"
        assert env[names.HAMI_SM_LIMIT] == str(core)
        # The ledger holds the pod's whole share whichever container asks.
        assert [(h.core_percent, h.memory_bytes) for h in decision.holds] == [(50, 5 * GiB)]


@pytest.mark.parametrize("container", ["log-sidecar", "init-setup"])
def test_a_container_named_for_no_gpu_gets_void_and_no_limits(container: str) -> None:
    decision = decide(_request(container, _two_container_share()), devices=_devices(), settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is not None and not decision.rejection
    assert dict(decision.edits.envs) == {names.NVIDIA_VISIBLE_DEVICES: names.NVIDIA_VISIBLE_DEVICES_VOID}
    assert decision.edits.mounts == ()
    assert [h.core_percent for h in decision.holds] == [50]


def test_an_allocation_that_names_no_container_is_refused_rather_than_guessed() -> None:
    gpu = _devices().gpus[0]
    share = GPUShare(gpu.minor, gpu.uuid, 50, 4 * GiB, 25)
    decision = decide(_request("main", share), devices=_devices(), settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is None
    assert names.ALLOCATION_CONTAINERS in decision.rejection and "fgpu-scheduler" in decision.rejection


def test_a_container_part_larger_than_the_pods_share_is_refused() -> None:
    gpu = _devices().gpus[0]
    share = GPUShare(gpu.minor, gpu.uuid, 50, 4 * GiB, 25, containers=(ContainerShare("main", 50, 8 * GiB, 50),))
    decision = decide(_request("main", share), devices=_devices(), settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is None and "container 'main'" in decision.rejection


@pytest.mark.parametrize("value", ['{"gpu":[]}', "{}"])
def test_an_empty_allocation_needs_no_signature_and_gets_no_answer(value: str) -> None:
    request = HookRequest(
        pod_uid=POD_UID, pod_namespace="ml", pod_name="p", container_name="main",
        annotations={names.DEVICE_ALLOCATED: value},
    )
    assert decide(request, devices=_devices(), settings=_settings(names.ISOLATION_HAMI_CORE)) == NO_ANSWER


def test_an_unsigned_allocation_listing_a_gpu_is_still_refused() -> None:
    gpu = _devices().gpus[0]
    share = GPUShare(gpu.minor, gpu.uuid, 50, GiB, 25, containers=(ContainerShare("main", 50, GiB, 25),))
    request = HookRequest(
        pod_uid=POD_UID, pod_namespace="ml", pod_name="p", container_name="main",
        annotations={names.DEVICE_ALLOCATED: encode_allocation(Allocation(gpus=(share,)))},
    )
    assert "not signed" in decide(request, devices=_devices(), settings=_settings(names.ISOLATION_HAMI_CORE)).rejection


def _half_share() -> GPUShare:
    gpu = _devices().gpus[0]
    return GPUShare(gpu.minor, gpu.uuid, 50, 4 * GiB, 25, containers=(ContainerShare("main", 50, 4 * GiB, 25),))


def test_under_hami_core_the_pods_own_isolation_variables_are_replaced_or_removed() -> None:
    decision = decide(_request("main", _half_share(), env=tuple(POD_ENV)), devices=_devices(), settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is not None
    env = dict(decision.edits.envs)
    # Off switches pinned (also overriding an image's ENV), limits the hook's own.
    assert env[names.HAMI_DISABLE_CONTROL] == "false"
    assert env[names.HAMI_OVERSUBSCRIBE] == "false"
    assert env[names.HAMI_CORE_POLICY] == "default"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m" and env[names.HAMI_MEMORY_LIMIT] == "4096m"
    assert env[names.HAMI_SM_LIMIT] == "50"
    assert env[names.CUDA_VISIBLE_DEVICES] == "0"
    unset = set(decision.edits.unset_envs)
    assert unset == {"CUDA_DEVICE_MEMORY_LIMIT_3", names.MPS_ACTIVE_THREAD_PERCENTAGE, names.MPS_PINNED_MEM_LIMIT,
                     "CUDA_MPS_CLIENT_PRIORITY"}
    assert "HOME" not in unset


def test_under_mps_the_hami_variables_are_removed_and_the_mps_ones_are_the_hooks() -> None:
    decision = decide(_request("main", _half_share(), env=tuple(POD_ENV)), devices=_devices(), settings=_settings(names.ISOLATION_MPS))
    assert decision.edits is not None
    env = dict(decision.edits.envs)
    assert env[names.MPS_ACTIVE_THREAD_PERCENTAGE] == "50"
    assert env[names.MPS_PINNED_MEM_LIMIT] == "0=4096M"
    unset = set(decision.edits.unset_envs)
    assert {names.HAMI_DISABLE_CONTROL, "CUDA_DEVICE_MEMORY_LIMIT_0", names.HAMI_MEMORY_LIMIT, names.HAMI_SM_LIMIT,
            names.HAMI_SHARED_CACHE, names.HAMI_OVERSUBSCRIBE, names.HAMI_CORE_POLICY, "CUDA_MPS_CLIENT_PRIORITY"} <= unset
    assert not unset & set(env)


def test_a_memory_only_mps_share_overrides_a_pod_thread_cap_with_no_cap() -> None:
    gpu = _devices().gpus[0]
    share = GPUShare(gpu.minor, gpu.uuid, 0, 4 * GiB, 25, containers=(ContainerShare("main", 0, 4 * GiB, 25),))
    decision = decide(_request("main", share, env=(names.MPS_ACTIVE_THREAD_PERCENTAGE,)), devices=_devices(),
                      settings=_settings(names.ISOLATION_MPS))
    assert decision.edits is not None
    assert dict(decision.edits.envs)[names.MPS_ACTIVE_THREAD_PERCENTAGE] == "100"


def test_shared_dirs_are_writable_by_any_user_whatever_the_umask(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "cache", "pod_main")
    old = os.umask(0o077)
    try:
        make_shared_dir(path)
        make_shared_dir(path)  # again: exists, still fine
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == 0o1777


def test_a_shared_dir_whose_mode_was_changed_is_set_back(tmp_path: object) -> None:
    # the fast path skips only a directory already right: mode, owner, and not a link
    path = os.path.join(str(tmp_path), "vgpulock")
    make_shared_dir(path)
    os.chmod(path, 0o755)
    make_shared_dir(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o1777


def test_a_memory_only_part_of_a_share_with_compute_is_refused() -> None:
    gpu = _devices().gpus[0]
    parts = (ContainerShare("main", 50, 2 * GiB, 25), ContainerShare("mem", 0, GiB, 10))
    share = GPUShare(gpu.minor, gpu.uuid, 50, 3 * GiB, 35, containers=parts)
    decision = decide(_request("mem", share), devices=_devices(), settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is None and "no compute limit" in decision.rejection


def test_hami_core_symbol_lookups_are_pinned_to_the_library_itself() -> None:
    decision = decide(_request("main", _half_share(), env=(names.HAMI_REDIRECT,)), devices=_devices(),
                      settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is not None
    assert dict(decision.edits.envs)[names.HAMI_REDIRECT] == "/usr/local/vgpu/libvgpu.so"


def test_a_symlink_planted_at_a_shared_dir_is_not_followed(tmp_path: object) -> None:
    target = os.path.join(str(tmp_path), "kubelet-state")
    os.makedirs(target, mode=0o700)
    planted = os.path.join(str(tmp_path), "vgpulock")
    os.symlink(target, planted)
    with pytest.raises(OSError):
        make_shared_dir(planted)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o700
