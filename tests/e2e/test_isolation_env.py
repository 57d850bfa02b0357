"""What each isolation backend puts in a share's environment, and that the pod cannot take it back:
its own isolation variables are removed or overridden, and a non-root container can use HAMi-core."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import pytest

from apis import names
from hack.localup import podrun
from tests.e2e.conftest import BACKENDS, Node, container, describe, pod, share_mib

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

HAMI_LIMIT_0 = f"{names.HAMI_MEMORY_LIMIT_PREFIX}0"
HAMI_MEMORY_LIMIT = names.HAMI_MEMORY_LIMIT
#: The values a pod would write to lift its own limits.
POD_ISOLATION_ENV = {
    names.HAMI_DISABLE_CONTROL: "true",
    names.HAMI_OVERSUBSCRIBE: "true",
    names.HAMI_CORE_POLICY: "disable",
    names.CUDA_VISIBLE_DEVICES: "1,0",
    HAMI_LIMIT_0: "999999m",
    HAMI_MEMORY_LIMIT: "999999m",
    names.HAMI_SM_LIMIT: "100",
    names.HAMI_SHARED_CACHE: "/tmp/x",
    names.MPS_ACTIVE_THREAD_PERCENTAGE: "100",
    names.MPS_PINNED_MEM_LIMIT: "0=999999M",
}


def half_gpu(node: Node, name: str, *, env: Mapping[str, str] | None = None) -> podrun.PodRun:
    return node.run(pod(name, [container("main", core=50, ratio=50, env=env)]))


def prefixed(env: dict[str, str], *prefixes: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(prefixes)}


def hami_vars(env: dict[str, str]) -> dict[str, str]:
    """HAMi-core's variables: its limits, its cache file, its off switch (not CUDA_DEVICE_ORDER, CUDA's own)."""
    return prefixed(env, "CUDA_DEVICE_MEMORY", "CUDA_DEVICE_SM", names.HAMI_DISABLE_CONTROL)


def mps_vars(env: dict[str, str]) -> dict[str, str]:
    return prefixed(env, "CUDA_MPS_")


@pytest.mark.parametrize("isolation", BACKENDS)
def test_each_backend_gives_a_half_gpu_share_its_own_limits(nodes: Callable[..., Node], isolation: str) -> None:
    node = nodes(isolation)
    pod_run = half_gpu(node, f"half-gpu-{isolation}")
    main = pod_run.container("main")
    assert main.succeeded, describe(pod_run)
    env = dict(main.env)
    assert env[names.FGPU_ISOLATION] == isolation, describe(pod_run)
    if isolation == "hami-core":
        assert env[HAMI_LIMIT_0] == f"{share_mib(50)}m", describe(pod_run)
        assert env[names.HAMI_SM_LIMIT] == "50", describe(pod_run)
        assert mps_vars(env) == {}, describe(pod_run)
    elif isolation == "mps":
        assert env[names.MPS_PIPE_DIRECTORY] == node.stack.isolation_paths()["mpsPipeDir"], describe(pod_run)
        assert env[names.MPS_PINNED_MEM_LIMIT] == f"0={share_mib(50)}M", describe(pod_run)
        assert env[names.MPS_ACTIVE_THREAD_PERCENTAGE] == "50", describe(pod_run)
        assert hami_vars(env) == {}, describe(pod_run)
    else:
        assert hami_vars(env) == {} and mps_vars(env) == {}, describe(pod_run)


@pytest.mark.parametrize("isolation", ["hami-core", "mps"])
def test_a_pod_cannot_set_its_own_isolation_variables(nodes: Callable[..., Node], isolation: str) -> None:
    node = nodes(isolation)
    # The hook's values, from the same share without the pod's own variables.
    reference = half_gpu(node, "limits-as-given").container("main")
    forged_run = half_gpu(node, "limits-rewritten", env=POD_ISOLATION_ENV)
    forged = forged_run.container("main")
    assert reference.succeeded and forged.succeeded, describe(forged_run)
    env = dict(forged.env)
    hami, mps = hami_vars(env), mps_vars(env)
    if isolation == "hami-core":
        # Off switches pinned to their safe values (a pinned value also overrides an image's ENV).
        assert env[names.HAMI_DISABLE_CONTROL] == "false", describe(forged_run)
        assert env[names.HAMI_OVERSUBSCRIBE] == "false", describe(forged_run)
        assert env[names.HAMI_CORE_POLICY] == "default", describe(forged_run)
        assert env[HAMI_MEMORY_LIMIT] == f"{share_mib(50)}m", describe(forged_run)
        assert env[names.CUDA_VISIBLE_DEVICES] == "0", describe(forged_run)
        assert mps == {}, describe(forged_run)
        assert env[HAMI_LIMIT_0] == f"{share_mib(50)}m", describe(forged_run)
        assert env[names.HAMI_SM_LIMIT] == "50", describe(forged_run)
        assert hami == hami_vars(dict(reference.env)), describe(forged_run)
    else:
        for absent in (names.HAMI_DISABLE_CONTROL, names.HAMI_OVERSUBSCRIBE, names.HAMI_CORE_POLICY):
            assert absent not in env, describe(forged_run)
        assert env[names.CUDA_VISIBLE_DEVICES] == "0", describe(forged_run)
        assert hami == {}, describe(forged_run)
        assert env[names.MPS_ACTIVE_THREAD_PERCENTAGE] == "50", describe(forged_run)
        assert env[names.MPS_PINNED_MEM_LIMIT] == f"0={share_mib(50)}M", describe(forged_run)
        assert mps == mps_vars(dict(reference.env)), describe(forged_run)


def test_a_share_in_an_image_that_bakes_in_hamis_off_switches_gets_them_pinned_back(hami: Node) -> None:
    pod_run = hami.run(pod("hostile-image", [container("main", core=50, ratio=50, image="fgpu.local/hostile:1")]))
    main = pod_run.container("main")
    assert main.succeeded, describe(pod_run)
    env = dict(main.env)
    assert env[names.HAMI_DISABLE_CONTROL] == "false", describe(pod_run)
    assert env[names.HAMI_REDIRECT] == "/usr/local/vgpu/libvgpu.so", describe(pod_run)
    assert env[names.HAMI_MEMORY_LIMIT] == f"{share_mib(50)}m", describe(pod_run)
    assert env[names.HAMI_OVERSUBSCRIBE] == "false", describe(pod_run)
    assert env[names.HAMI_CORE_POLICY] == "default", describe(pod_run)
    assert env[names.CUDA_VISIBLE_DEVICES] == "0", describe(pod_run)
    assert env[names.NVIDIA_VISIBLE_DEVICES].startswith("GPU-"), describe(pod_run)


def test_a_non_root_container_can_write_its_hami_cache_and_the_lock_dir(hami: Node) -> None:
    lock_dir = "/tmp/vgpulock"  # where HAMi-core looks; the host's hamiLockDir is mounted there
    script = (
        'echo "E2E_UID=$(id -u)"; env; '
        'echo x > "$CUDA_DEVICE_MEMORY_SHARED_CACHE" && echo x > "$E2E_LOCK_DIR/e2e-$E2E_POD_UID.lock"'
    )
    spec = pod("non-root-share", [container(
        "main", core=50, ratio=50, run_as_user=1000, command=["sh", "-c", script], env={"E2E_LOCK_DIR": lock_dir},
    )])
    spec["spec"]["containers"][0]["env"].append(
        {"name": "E2E_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
    )
    pod_run = hami.run(spec)
    main = pod_run.container("main")
    assert main.env.get("E2E_UID") == "1000", describe(pod_run)
    assert main.env[names.FGPU_ISOLATION] == "hami-core", describe(pod_run)
    assert main.succeeded, describe(pod_run)
    lock = os.path.join(hami.stack.isolation_paths()["hamiLockDir"], f"e2e-{pod_run.uid}.lock")
    assert os.stat(lock).st_uid == 1000
    os.unlink(lock)
