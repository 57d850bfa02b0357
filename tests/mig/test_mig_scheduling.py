"""The scheduler reads the pod's MIG choice (`fgpu.io/gpu-mode`), places by it, and says why it cannot."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.inventory import GPUInfo, MIGInstance
from apis.mig import A100_80GB, MIGMode
from apis.request import RequestError
from scheduler_plugin.core.api import NodeName, PodRequest
from scheduler_plugin.core.podrequest import pod_request_from_pod
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import gpu, node, pod, share, whole

PROFILES = {p.name: p for p in A100_80GB}


def mig_gpu(name: str, index: int, *instances: tuple[str, int]) -> GPUInfo:
    """An A100 80GB in MIG mode reporting NVIDIA's profiles; `instances` are operator-made (profile, start)."""
    made = tuple(
        MIGInstance(
            uuid=f"MIG-{name}-{index}-{start}", profile=profile, memory_bytes=PROFILES[profile].memory_bytes,
            slices=PROFILES[profile].slices, profile_id=PROFILES[profile].profile_id, placement_start=start,
            placement_size=PROFILES[profile].placements[0].size,
        )
        for profile, start in instances
    )
    return replace(gpu(name, index), mig_enabled=True, mig_instances=made, mig_profiles=A100_80GB)


def pod_dict(annotations: dict[str, str], resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": resources}}]},
    }


SHARE_20 = {names.GPU_CORE: 30, names.GPU_MEMORY: "20Gi"}


@pytest.mark.parametrize(
    ("annotations", "mode"),
    [({}, MIGMode.ANY), ({names.GPU_MODE: "mig"}, MIGMode.MIG), ({names.GPU_MODE: "shared"}, MIGMode.SHARED)],
)
def test_the_pod_request_carries_the_gpu_mode(annotations: dict[str, str], mode: MIGMode) -> None:
    assert pod_request_from_pod(pod_dict(annotations, SHARE_20)).mig_mode is mode


@pytest.mark.parametrize(
    ("value", "resources", "fragment"),
    [
        ("MIG", SHARE_20, "fgpu.io/gpu-mode='MIG' is not a GPU mode; write 'mig'"),
        ("mig", {names.NVIDIA_GPU: 1}, "asks for whole GPUs; drop the annotation"),
        ("mig", {**SHARE_20, names.GPU_SHARED: 2}, "set koordinator.sh/gpu.shared=1"),
        ("mig", {}, "asks for no GPU; add the memory"),
    ],
)
def test_a_gpu_mode_the_scheduler_cannot_honour_is_refused_naming_field_value_and_fix(
    value: str, resources: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(RequestError) as caught:
        pod_request_from_pod(pod_dict({names.GPU_MODE: value}, resources))
    assert any(fragment in e for e in caught.value.errors), caught.value.errors


def test_a_bad_gpu_mode_is_reported_beside_a_bad_resource() -> None:
    with pytest.raises(RequestError) as caught:
        pod_request_from_pod(pod_dict({names.GPU_MODE: "vgpu"}, {names.GPU_CORE: 150, names.GPU_MEMORY: "1Gi"}))
    assert len(caught.value.errors) == 2
    assert "'vgpu' is not a GPU mode" in caught.value.errors[1]


def with_mode(request: PodRequest, mode: MIGMode) -> PodRequest:
    return replace(request, mig_mode=mode)


def cluster(*, mig_instances: tuple[tuple[str, int], ...] = (), plain: bool = True) -> Scheduler:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("mig", gpus=[mig_gpu("mig", 0, *mig_instances)]))
    if plain:
        scheduler.upsert_node_devices(node("plain", 1))
    return scheduler


def place(scheduler: Scheduler, request: PodRequest) -> tuple[NodeName, Allocation] | None:
    chosen = scheduler.select(request)
    return None if chosen is None else (chosen, scheduler.reserve(request, chosen))


def test_a_mig_pod_gets_a_new_instance_even_where_a_regular_gpu_fits() -> None:
    got = place(cluster(), with_mode(pod("a", share(30, gib=20)), MIGMode.MIG))

    assert got is not None
    node_name, allocation = got
    assert node_name == "mig"
    assert (allocation.gpus[0].mig_profile, allocation.gpus[0].mig_placement) == ("3g.40gb", 4)


def test_a_shared_pod_never_gets_a_mig_instance() -> None:
    scheduler = cluster(plain=False)
    request = with_mode(pod("a", share(30, gib=20)), MIGMode.SHARED)

    assert scheduler.select(request) is None
    (verdict,) = scheduler.filter(request, [NodeName("mig")])
    assert verdict.reason == (
        "0 of 1 healthy GPUs usable (1 in MIG mode, the pod's fgpu.io/gpu-mode=shared refuses MIG instances), "
        "pod needs 1 GPU share of 30% core and 20Gi"
    )
    assert verdict.unresolvable


def test_without_a_mode_a_share_takes_a_mig_instance_when_no_regular_gpu_is_there() -> None:
    got = place(cluster(plain=False), pod("a", share(30, gib=20)))

    assert got is not None and got[1].gpus[0].mig_profile == "3g.40gb"


def test_successive_mig_pods_fill_the_gpu_without_overlap() -> None:
    scheduler = cluster(plain=False)
    starts = []
    for i, gib in enumerate((30, 30)):
        got = place(scheduler, with_mode(pod(f"p{i}", share(10, gib=gib)), MIGMode.MIG))
        assert got is not None
        share_ = got[1].gpus[0]
        starts.append((share_.mig_profile, share_.mig_placement))
    # Two 3g.40gb fill memory slices 0..7: nothing is left for a 1g.
    assert starts == [("3g.40gb", 4), ("3g.40gb", 0)]
    assert place(scheduler, with_mode(pod("p9", share(10, gib=5)), MIGMode.MIG)) is None


@dataclass(frozen=True)
class ReasonCase:
    name: str
    instances: tuple[tuple[str, int], ...]
    gib: int
    mode: MIGMode
    reason: str
    unresolvable: bool


REASON_CASES = [
    ReasonCase(
        "the GPU is carved so that no placement of the smallest covering profile is free",
        (("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)),
        30,
        MIGMode.MIG,
        "no free MIG instance holds 1 GPU share of 10% core and 30Gi (free instances: 1g.10gb, 2g.20gb) and "
        "no placement for profile 3g.40gb is free on GPU 0 (holds 4g.40gb@0, 2g.20gb@4, 1g.10gb@6)",
        False,
    ),
    ReasonCase(
        "no profile holds the memory",
        (),
        90,
        MIGMode.MIG,
        "no free MIG instance holds 1 GPU share of 10% core and 90Gi (free instances: none) and "
        "no MIG profile of GPU 0 holds 90Gi (largest: 7g.80gb, 79Gi)",
        True,
    ),
    ReasonCase(
        "without a mode, on a node with MIG GPUs only",
        (("7g.80gb", 0),),
        30,
        MIGMode.ANY,
        "no free MIG instance holds 1 GPU share of 10% core and 30Gi (free instances: none) and "
        "no placement for profile 3g.40gb is free on GPU 0 (holds 7g.80gb@0)",
        False,
    ),
]


@pytest.mark.parametrize("case", REASON_CASES, ids=[c.name for c in REASON_CASES])
def test_why_no_instance_exists_and_none_can_be_created(case: ReasonCase) -> None:
    scheduler = cluster(mig_instances=case.instances, plain=False)
    # The first operator instance is held by a pod; the others are free but too small.
    if case.instances:
        held = GPUShare(0, "GPU-mig-0", 0, 0, 0, mig_uuid=f"MIG-mig-0-{case.instances[0][1]}")
        scheduler.add_pod(pod("holder"), NodeName("mig"), Allocation(gpus=(held,)))
    request = with_mode(pod("p", share(10, gib=case.gib)), case.mode)

    (verdict,) = scheduler.filter(request, [NodeName("mig")])

    assert (verdict.feasible, verdict.reason, verdict.unresolvable) == (False, case.reason, case.unresolvable)


def test_a_mig_pod_on_a_node_without_mig_gpus_is_told_so() -> None:
    request = with_mode(pod("p", share(10, gib=5)), MIGMode.MIG)

    (verdict,) = cluster().filter(request, [NodeName("plain")])

    assert verdict.reason == (
        "pod asks for a MIG instance (fgpu.io/gpu-mode=mig) for 1 GPU share of 10% core and 5Gi, "
        "but no GPU here is in MIG mode"
    )
    assert verdict.unresolvable


def _varied() -> Scheduler:
    scheduler = Scheduler()
    for devices in (
        node("plain-a", 4),
        node("t4", 2, model="T4", memory_gib=16),
        node("mig-empty", gpus=[mig_gpu("mig-empty", 0), mig_gpu("mig-empty", 1)]),
        node("mig-carved", gpus=[mig_gpu("mig-carved", 0, ("4g.40gb", 0), ("3g.40gb", 4))]),
        node("mig-old", gpus=[gpu("mig-old", 0, mig=[("1g.10gb", 10)])]),
        node("mixed", gpus=[mig_gpu("mixed", 0, ("1g.10gb", 6)), gpu("mixed", 1)]),
    ):
        scheduler.upsert_node_devices(devices)
    scheduler.add_pod(
        pod("holder"), NodeName("mig-carved"), Allocation(gpus=(GPUShare(0, "", 0, 0, 0, mig_uuid="MIG-mig-carved-0-0"),))
    )
    scheduler.add_pod(
        pod("promised"), NodeName("mig-empty"),
        Allocation(gpus=(GPUShare(0, "GPU-mig-empty-0", 0, 0, 0, mig_profile="7g.80gb", mig_placement=0),)),
    )
    return scheduler


VARIED = _varied()


@settings(max_examples=80, deadline=None)
@given(
    device=st.one_of(
        st.builds(lambda core, gib: share(core, gib=gib), st.sampled_from([0, 30, 100]), st.sampled_from([4, 15, 35, 70, 90])),
        st.builds(lambda ratio: share(10, ratio=ratio), st.sampled_from([10, 50, 100])),
        st.builds(lambda cards: share(10, gib=5, cards=cards), st.integers(2, 3)),
        st.builds(whole, st.integers(1, 2)),
    ),
    mode=st.sampled_from(list(MIGMode)),
    use=st.sampled_from([(), ("T4",)]),
)
def test_every_bulk_verdict_equals_the_node_explained_alone(device: Any, mode: MIGMode, use: tuple[str, ...]) -> None:
    mig_only_possible = device.gpus == 1 and not device.whole
    request = with_mode(pod("p", device, use=use), mode if mig_only_possible else MIGMode.ANY)
    for verdict in VARIED.filter(request, [NodeName(n) for n in sorted(VARIED.state.slot_of)]):
        assert verdict == VARIED.explain_node(request, verdict.node_name)
