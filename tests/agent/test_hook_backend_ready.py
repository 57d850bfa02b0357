"""A node whose isolation backend cannot work takes no GPU share it cannot enforce; whole GPUs and MIG still work."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.hook import decide
from apis import names
from apis.allocation import ContainerShare, GPUShare
from tests.agent.helpers import A100_MIG
from tests.agent.test_hook import _devices, _request, _settings, _share, _signed

PROBLEM = "isolation hami-core: HAMi-core's library /usr/local/vgpu/libvgpu.so cannot be read (No such file or directory)"


@pytest.mark.parametrize("isolation", [names.ISOLATION_HAMI_CORE, names.ISOLATION_MPS])
def test_a_limited_share_is_refused_with_the_backends_problem_and_what_still_works(isolation: str) -> None:
    devices = _devices()
    settings = replace(_settings(isolation), backend_problem=PROBLEM)
    decision = decide(_request(_signed(_share(devices, 0, core=50, memory=4 * 2**30))), devices=devices, settings=settings)
    assert decision.edits is None and decision.holds == ()
    assert f"node {settings.node_name} cannot enforce a GPU share now: {PROBLEM}" in decision.rejection
    assert "Whole GPUs and MIG instances still work here" in decision.rejection
    assert "FgpuIsolationReady" in decision.rejection


def test_the_same_share_is_admitted_once_the_backend_is_ready() -> None:
    devices = _devices()
    decision = decide(_request(_signed(_share(devices, 0))), devices=devices, settings=_settings(names.ISOLATION_HAMI_CORE))
    assert decision.edits is not None and not decision.rejection


def test_a_whole_gpu_still_starts_on_a_node_whose_backend_is_not_ready() -> None:
    devices = _devices()
    whole = _share(devices, 0, core=100, memory=devices.gpus[0].memory_bytes, ratio=100)
    settings = replace(_settings(names.ISOLATION_HAMI_CORE), backend_problem=PROBLEM)
    decision = decide(_request(_signed(whole)), devices=devices, settings=settings)
    assert decision.edits is not None and not decision.rejection
    assert dict(decision.edits.envs)[names.FGPU_ISOLATION] == "none"


def test_a_mig_instance_still_starts_on_a_node_whose_backend_is_not_ready() -> None:
    devices = _devices(A100_MIG)
    gpu = devices.gpus[1]
    mig = gpu.mig_instances[0]
    share = GPUShare(
        minor=gpu.minor, uuid=gpu.uuid, core_percent=100, memory_bytes=mig.memory_bytes, memory_ratio_percent=100,
        mig_uuid=mig.uuid, containers=(ContainerShare("main", 100, mig.memory_bytes, 100),),
    )
    settings = replace(_settings(names.ISOLATION_MPS), backend_problem="isolation mps: no MPS control daemon on this node")
    decision = decide(_request(_signed(share)), devices=devices, settings=settings)
    assert decision.edits is not None and not decision.rejection
    assert dict(decision.edits.envs)[names.NVIDIA_VISIBLE_DEVICES] == mig.uuid
