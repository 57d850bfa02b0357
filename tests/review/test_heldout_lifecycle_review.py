"""Held-out review: container lifecycles kubelet really produces, end to end.

Each case drives the CRI calls as kubelet makes them (fgpu-scheduler's gRPC API ->
fgpu-runtime-proxy -> the real fgpu-agent hook, with the shipped registration -> real
containerd) and reads the container's OWN environment (what it printed, or `env` run in it):

- a crashed GPU container created again in its sandbox (`metadata.attempt` 1, 2, ...), also
  after an agent restart between attempts;
- an ephemeral container (`kubectl debug`) and a container named in no list, in a GPU pod;
- a pod's sandbox re-created (attempt 1) after the old one died, and the old sandbox's
  StopPodSandbox sent again late, as kubelet's garbage collector does before RemovePodSandbox;
- UpdateContainerResources on a GPU container, and images that bake GPU variables in;
- pods that share container names, or a pod name across namespaces.

Whether the node counts a pod's share is read from the node's own refusals: a pod whose
allocation (signed with the cluster key by the test, as a scheduler with a stale view would
write it) asks for more than the GPU has left must be refused, naming the pods that hold it.

Each case was written as a test first; the re-created sandbox's (3) failed: the old sandbox's late
stop released the running pod's shares and cache directories. Fixed in the agent's hook server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from apis import names
from apis.allocation import GPUShare, decode_allocation
from hack.localup import cri, podrun, report
from hack.localup.report import ContainerOutcome, ContainerState
from tests.containerd import images
from tests.containerd.images import ImageSpec
from tests.e2e import conftest as e2e
from tests.e2e.conftest import Node, container, describe, isolation_vars, pod
from tests.e2e.test_agent_lifecycle import stale_pod
from tests.runtimeproxy.kubelet import Kubelet as ResourcesKubelet

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

stacks = e2e.stacks
nodes = e2e.nodes

VOID = names.NVIDIA_VISIBLE_DEVICES_VOID
SLEEP = ["sleep", "3600"]
#: Where the hami-core backend mounts its library, preload file, cache and lock directory in a container.
FGPU_PATHS = ("/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload", "/usr/local/vgpu/cache", "/tmp/vgpulock")
#: Prints which of FGPU_PATHS the container has, as one env-like line the env parser keeps.
PROBE = "printf 'PATHS_SEEN='; for p in " + " ".join(FGPU_PATHS) + "; do test -e $p && printf '%s ' $p; done; echo"

#: An image whose author baked in GPU visibility, MPS settings and a preload, as CUDA/MPS images do.
BAKED = ImageSpec(ref="fgpu.local/baked-gpu-env:1", env=(
    "PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all",
    "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
    "LD_PRELOAD=/usr/local/vgpu/libvgpu.so",
))
#: The image's own CUDA_MPS_* variables: CRI cannot remove image ENV, and in a `void` container they reach no GPU.
BAKED_VARS = {e.partition("=")[0] for e in BAKED.env if e.startswith("CUDA_MPS_")}


@pytest.fixture
def node(nodes: Callable[..., Node]) -> Node:
    node = nodes("hami-core", purpose="lifecycle")
    node.stack.start_agent()  # whatever an earlier case left
    return node


def _import_baked(node: Node) -> None:
    """BAKED into the stack's containerd (its `import_images` imports only once, the stack's own)."""
    ctrd = node.stack.containerd
    for path in images.write_archives(os.path.join(ctrd.base_dir, "images"), (BAKED,)).values():
        ctrd.ctr("images", "import", "--no-unpack", path)


def _gpu_view(env: Mapping[str, str]) -> dict[str, str]:
    """What decides a container's GPUs and limits: NVIDIA_*, CUDA_* and FGPU_* variables."""
    return {k: v for k, v in env.items() if k.startswith(("NVIDIA_", "CUDA_", "FGPU_"))}


def _only_share(run: podrun.PodRun) -> GPUShare:
    (share,) = decode_allocation(run.annotations[names.DEVICE_ALLOCATED]).gpus
    return share


def _crash_and_restart(node: Node, run: podrun.PodRun, name: str) -> ContainerOutcome:
    """kubelet after a crash: CreateContainer again in the same sandbox with the next attempt number."""
    run.outcomes.pop(name)
    # kubelet logs each attempt to a file of its own; this runner reuses one, so start it afresh.
    os.unlink(os.path.join(run.sandbox_config.log_directory, f"{name}.log"))
    node.resume(run)
    return run.container(name)


def _assert_refused_for(run: podrun.PodRun, holder: podrun.PodRun) -> None:
    main = run.container("main")
    assert main.state is ContainerState.REFUSED, (
        f"the node admitted a pod on top of {holder.name}'s share, which it no longer counts\n" + describe(run)
    )
    assert holder.uid in main.error, f"refused, but not for {holder.name}'s share: {main.error}"


def _in_sandbox(node: Node, run: podrun.PodRun, extra: dict[str, Any]) -> podrun.PodRun:
    """`extra` created and run in `run`'s sandbox with its sandbox config, as kubelet creates an
    ephemeral container. kubelet's CreateContainer for one is an app container's; which list of
    the pod spec named it (`ephemeralContainers`, or none) never reaches the node."""
    view = podrun.PodRun(
        pod={**run.pod, "spec": {"containers": [extra]}}, node=run.node,
        sandbox_config=run.sandbox_config, sandbox_id=run.sandbox_id,
    )
    podrun.run(node.kubelet, view)
    run.created.extend(view.created)  # removed with the pod
    return view


def _exec_env(node: Node, container_id: str, command: str = "env") -> dict[str, str]:
    result = node.kubelet.exec_sync(container_id, ["sh", "-c", command])
    return report.env_from_lines(result.stdout.splitlines())


# --- 1. a crashed GPU container restarted by kubelet ----------------------------------------------------


def test_a_restarted_gpu_container_gets_the_same_gpu_and_limits_and_its_pod_counts_once(node: Node) -> None:
    crashing = ["sh", "-c", "env; exit 3"]
    run = node.run(pod("crashloop", [container("main", core=30, ratio=30, command=crashing)]))
    first = run.container("main")
    assert first.state is ContainerState.EXITED and first.exit_code == 3, describe(run)
    share = _only_share(run)
    view = _gpu_view(first.env)
    assert view[names.NVIDIA_VISIBLE_DEVICES] == share.uuid and view[names.FGPU_CORE_PERCENT] == "30", describe(run)

    for attempt in (1, 2):
        again = _crash_and_restart(node, run, "main")
        assert again.state is ContainerState.EXITED, f"attempt {attempt} refused or lost\n" + describe(run)
        assert run.attempts["main"] == attempt
        assert _gpu_view(again.env) == view, f"attempt {attempt} saw other GPU settings\n" + describe(run)

    # Counted once: the other 70% of the card is still free to a pod the scheduler signed for it.
    rest = stale_pod(node, "takes-the-rest", like=share, core=70)
    assert rest.container("main").succeeded, "three attempts of one 30% pod were counted as more\n" + describe(rest)

    node.stack.restart_agent()
    again = _crash_and_restart(node, run, "main")
    assert again.state is ContainerState.EXITED, "after an agent restart the restart was refused\n" + describe(run)
    assert _gpu_view(again.env) == view, describe(run)
    # ... and the restarted agent still counts it.
    _assert_refused_for(stale_pod(node, "one-more", like=share, core=1), run)


# --- 2. ephemeral containers, and a container named in no list ----------------------------------------


def test_an_ephemeral_or_unlisted_container_in_a_gpu_pod_sees_void_and_leaves_the_share_alone(node: Node) -> None:
    _import_baked(node)
    run = node.run(pod("debugged", [container("main", core=40, ratio=40, command=SLEEP)]), leave_running=True)
    main = run.container("main")
    assert main.state is ContainerState.RUNNING, describe(run)
    share = _only_share(run)
    before = _gpu_view(main.env)
    assert before[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, describe(run)
    # Control: the probe sees the backend's mounts where they are.
    assert _exec_env(node, main.container_id, PROBE)["PATHS_SEEN"].split() == list(FGPU_PATHS)

    probe = ["sh", "-c", f"env; {PROBE}"]
    # `kubectl debug -it debugged --image=...` (in spec.ephemeralContainers), and a name in no list at all.
    debugger = container("debugger", image=BAKED.ref, command=probe)
    stray = container("stray", image=BAKED.ref, command=probe, env={names.NVIDIA_VISIBLE_DEVICES: "all"})
    for name, spec in (("debugger", debugger), ("stray", stray)):
        extra = _in_sandbox(node, run, spec).container(name)
        assert extra.succeeded, describe(run) + f"\n  {name}: {extra.describe()}"
        assert extra.env[names.NVIDIA_VISIBLE_DEVICES] == VOID, f"{name}: {_gpu_view(extra.env)}"
        assert not set(isolation_vars(extra.env)) - BAKED_VARS, f"{name}: {isolation_vars(extra.env)}"
        assert extra.env["PATHS_SEEN"] == "", f"{name} got fgpu's mounts: {extra.env['PATHS_SEEN']}"

    assert node.container_running(main.container_id), "a debug container stopped the app container"
    assert _gpu_view(_exec_env(node, main.container_id)) == before
    _assert_refused_for(stale_pod(node, "over-debugged", like=share, core=61), run)


# --- 3. the pod's sandbox re-created ---------------------------------------------------------------------


def test_a_recreated_sandbox_keeps_the_pods_gpu_and_the_old_sandboxs_late_stop_frees_nothing(node: Node) -> None:
    run = node.run(pod("resandboxed", [container("main", core=30, ratio=30, command=SLEEP)]), leave_running=True)
    main = run.container("main")
    assert main.state is ContainerState.RUNNING, describe(run)
    share = _only_share(run)
    view = _gpu_view(main.env)
    old_sandbox, old_container = run.sandbox_id, main.container_id

    # The sandbox died (a reboot, a network change): kubelet kills the pod, then makes a new sandbox
    # (attempt 1) and creates the containers in it again.
    node.kubelet.stop_container(old_container, timeout_s=0)
    node.kubelet.stop_pod_sandbox(old_sandbox)
    config = cri.M["PodSandboxConfig"]()
    config.CopyFrom(run.sandbox_config)
    config.metadata.attempt = 1
    again = podrun.PodRun(pod=run.pod, node=run.node, sandbox_config=config, attempts=dict(run.attempts))
    again.sandbox_id = node.kubelet.run_pod_sandbox(config)
    node._runs.append(again)  # removed when the test ends, as Node.start's are
    podrun.run(node.kubelet, again, leave_running=True)
    new_main = again.container("main")
    assert new_main.state is ContainerState.RUNNING, describe(again)
    assert _gpu_view(new_main.env) == view, describe(again)

    rest = stale_pod(node, "rest-of-card", like=share, core=70)
    assert rest.container("main").succeeded, "the re-created pod was counted twice\n" + describe(rest)

    # kubelet's garbage collector stops an old sandbox again before it removes it.
    node.kubelet.stop_pod_sandbox(old_sandbox)
    node.kubelet.remove_container(old_container)
    node.kubelet.remove_pod_sandbox(old_sandbox)
    time.sleep(0.5)  # the proxy notifies PostStopPodSandbox in the background

    assert node.container_running(new_main.container_id)
    _assert_refused_for(stale_pod(node, "after-gc", like=share, core=1), again)
    cache = _exec_env(node, new_main.container_id, "touch /usr/local/vgpu/cache/probe && echo CACHE=ok")
    assert cache.get("CACHE") == "ok", "the running container's HAMi-core cache directory was removed"


# --- 4. UpdateContainerResources, and images that bake GPU variables in -----------------------------------


def test_update_container_resources_passes_through_and_leaves_the_gpu_settings_alone(node: Node) -> None:
    run = node.run(pod("resized", [container("main", core=20, ratio=20, command=SLEEP)]), leave_running=True)
    main = run.container("main")
    assert main.state is ContainerState.RUNNING, describe(run)
    before = _gpu_view(main.env)
    with ResourcesKubelet(node.stack.proxy_address) as k:
        # In-place resize and the CPU manager: cgroup values only, by a full ID and by a prefix.
        k.update_resources(main.container_id, cpu_shares=512, memory_limit_in_bytes=256 << 20)
        k.update_resources(main.container_id[:12], cpuset_cpus="0")
    assert node.container_running(main.container_id)
    assert _gpu_view(_exec_env(node, main.container_id)) == before


def test_an_image_that_bakes_in_gpu_variables_gets_void_and_no_preload_without_a_gpu_request(node: Node) -> None:
    _import_baked(node)
    probe = ["sh", "-c", f"env; {PROBE}"]
    cpu = node.run(pod("baked-cpu", [container("main", image=BAKED.ref, command=probe)], scheduler=""))
    gpu = node.run(pod("baked-sidecar", [
        container("trainer", core=10, ratio=10), container("main", image=BAKED.ref, command=probe),
    ]))
    for run in (cpu, gpu):
        main = run.container("main")
        assert main.succeeded, describe(run)
        # containerd lays the CRI env over the image's: the proxy's `void` wins over the baked `all`.
        assert main.env[names.NVIDIA_VISIBLE_DEVICES] == VOID, describe(run)
        assert main.env["PATHS_SEEN"] == "", f"{run.name}: fgpu's mounts in a container without GPUs"
        assert not set(isolation_vars(main.env)) - BAKED_VARS, describe(run)
        assert not {k for k in main.env if k.startswith(("FGPU_", "CUDA_DEVICE_"))}, describe(run)


# --- 5. names shared between pods ------------------------------------------------------------------------


def test_pods_sharing_a_name_across_namespaces_and_container_names_each_get_their_own_share(node: Node) -> None:
    runs = []
    for namespace in ("team-a", "team-b"):
        spec = pod("twin", [container("main", core=60, ratio=60, command=SLEEP)])
        spec["metadata"]["namespace"] = namespace
        run = node.run(spec, leave_running=True)
        assert run.container("main").state is ContainerState.RUNNING, describe(run)
        runs.append(run)
    a, b = runs
    share_a, share_b = _only_share(a), _only_share(b)
    assert share_a.uuid != share_b.uuid, "60% + 60% on one card"
    for run, share in ((a, share_a), (b, share_b)):
        env = _exec_env(node, run.container("main").container_id)
        assert env[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, describe(run)
        _assert_refused_for(stale_pod(node, f"over-{run.namespace}", like=share, core=41), run)
    cache_root = node.stack.isolation_paths()["hamiCacheRoot"]
    assert all(os.path.isdir(os.path.join(cache_root, f"{r.uid}_main")) for r in runs), os.listdir(cache_root)
