"""Which containers see which GPUs: a container sees a GPU only if it asked for one itself, and
then only its own part of the pod's share (cases: CPU pod, sidecar, two GPU containers, init)."""

from __future__ import annotations

import pytest

from apis import names
from apis.allocation import GPUShare, decode_allocation
from hack.localup import podrun
from tests.e2e.conftest import CUDA_LIKE, Node, container, describe, isolation_vars, pod, share_mib

pytestmark = [pytest.mark.containerd, pytest.mark.slow]

VOID = names.NVIDIA_VISIBLE_DEVICES_VOID


def only_gpu(pod_run: podrun.PodRun) -> GPUShare:
    """The one GPU share of the pod's allocation, as the scheduler wrote and signed it."""
    annotation = pod_run.annotations.get(names.DEVICE_ALLOCATED)
    assert annotation, f"no {names.DEVICE_ALLOCATED} annotation on a GPU pod\n{describe(pod_run)}"
    (share,) = decode_allocation(annotation).gpus
    return share


def test_a_cpu_pod_through_fgpu_scheduler_gets_no_allocation_and_sees_void(hami: Node) -> None:
    scheduled = hami.schedule(pod("cpu-only", [container("main", image=CUDA_LIKE)]))
    assert names.DEVICE_ALLOCATED not in scheduled.placement.annotations
    stored = hami.stack.bound_pod(scheduled.pod["metadata"]["uid"])
    written = (stored or {}).get("metadata", {}).get("annotations") or {}
    assert names.DEVICE_ALLOCATED not in written, f"the scheduler stored {written}"

    pod_run = hami.resume(hami.start(scheduled))
    main = pod_run.container("main")
    assert main.succeeded, describe(pod_run)
    assert main.env[names.NVIDIA_VISIBLE_DEVICES] == VOID, describe(pod_run)


@pytest.mark.parametrize("sidecar_first", [True, False], ids=["sidecar-listed-first", "sidecar-listed-last"])
def test_only_the_container_that_asked_for_a_gpu_sees_it_and_its_sidecar_sees_void(
    hami: Node, sidecar_first: bool
) -> None:
    trainer = container("trainer", core=50, ratio=50)
    sidecar = container("log-shipper", image=CUDA_LIKE)
    pod_run = hami.run(pod("gpu-and-sidecar", [sidecar, trainer] if sidecar_first else [trainer, sidecar]))
    share = only_gpu(pod_run)
    gpu, side = pod_run.container("trainer"), pod_run.container("log-shipper")
    assert gpu.succeeded and side.succeeded, describe(pod_run)

    assert gpu.env[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, describe(pod_run)
    assert gpu.env[names.FGPU_CORE_PERCENT] == "50", describe(pod_run)
    assert side.env[names.NVIDIA_VISIBLE_DEVICES] == VOID, describe(pod_run)
    assert isolation_vars(side.env) == {}, describe(pod_run)


def test_two_gpu_containers_share_one_gpu_each_limited_to_its_own_request(hami: Node) -> None:
    pod_run = hami.run(pod("two-gpu-containers", [container("a", core=30, ratio=30), container("b", core=20, ratio=20)]))
    share = only_gpu(pod_run)
    a, b = pod_run.container("a"), pod_run.container("b")
    assert a.succeeded and b.succeeded, describe(pod_run)

    for c, percent in ((a, 30), (b, 20)):
        assert c.env[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, describe(pod_run)
        assert c.env[names.FGPU_CORE_PERCENT] == str(percent), describe(pod_run)
        assert c.env[f"{names.HAMI_MEMORY_LIMIT_PREFIX}0"] == f"{share_mib(percent)}m", describe(pod_run)
        assert c.env[names.HAMI_SM_LIMIT] == str(percent), describe(pod_run)
    # Together, no more than the pod was given (and all of it: the request was 30 + 20).
    assert int(a.env[names.FGPU_CORE_PERCENT]) + int(b.env[names.FGPU_CORE_PERCENT]) == share.core_percent == 50
    memory = int(a.env[names.FGPU_MEMORY_BYTES]) + int(b.env[names.FGPU_MEMORY_BYTES])
    assert memory <= share.memory_bytes, describe(pod_run)
    limits_mib = sum(int(c.env[f"{names.HAMI_MEMORY_LIMIT_PREFIX}0"].removesuffix("m")) for c in (a, b))
    # Each part is rounded down to whole MiB on its own, so the parts may miss the pod's total by 1 MiB.
    assert share.memory_bytes // 2**20 - 1 <= limits_mib <= share.memory_bytes // 2**20, describe(pod_run)


def test_an_init_container_sees_its_whole_gpu_and_the_app_container_its_half(hami: Node) -> None:
    pod_run = hami.run(
        pod("gpu-init", [container("app", core=50, ratio=50)], init=[container("warmup", core=100, ratio=100)])
    )
    share = only_gpu(pod_run)
    # Kubernetes' effective request: max(init 100, app 50).
    assert (share.core_percent, share.memory_ratio_percent) == (100, 100), describe(pod_run)
    init, app = pod_run.container("warmup"), pod_run.container("app")
    assert init.succeeded and app.succeeded, describe(pod_run)

    assert init.env[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, describe(pod_run)
    assert init.env[names.FGPU_CORE_PERCENT] == "100", describe(pod_run)
    assert app.env[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, describe(pod_run)
    assert app.env[names.FGPU_CORE_PERCENT] == "50", describe(pod_run)
    assert app.env[names.HAMI_SM_LIMIT] == "50", describe(pod_run)


def test_an_init_container_without_gpu_requests_in_a_gpu_pod_sees_void(hami: Node) -> None:
    pod_run = hami.run(
        pod("plain-init", [container("app", core=50, ratio=50)], init=[container("setup", image=CUDA_LIKE)])
    )
    share = only_gpu(pod_run)
    setup, app = pod_run.container("setup"), pod_run.container("app")
    assert setup.succeeded and app.succeeded, describe(pod_run)

    assert setup.env[names.NVIDIA_VISIBLE_DEVICES] == VOID, describe(pod_run)
    assert isolation_vars(setup.env) == {}, describe(pod_run)
    assert app.env[names.NVIDIA_VISIBLE_DEVICES] == share.uuid, describe(pod_run)
    assert app.env[names.FGPU_CORE_PERCENT] == "50", describe(pod_run)
