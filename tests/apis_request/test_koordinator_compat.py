"""fgpu reads a pod's GPU request as Koordinator's scheduler does, or differs on purpose, row by row.

Each row cites the Koordinator rule it follows (file in `pkg/scheduler/plugins/deviceshare/`,
function, the rule in words). A row whose `differs` is set is a deliberate difference:
Koordinator accepts the pod but its reading is a bug (the pod can never be placed, or a
container would get no GPU memory); docs/translation-rules.md ("Differences from
Koordinator") gives the same reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis import names
from apis.allocation import Allocation, GPUShare
from apis.container_split import split_allocation
from apis.request import DeviceRequest, RequestError, container_requests, parse_pod
from tests.apis_request.podspecs import container, limits_pod, pod

GI = 2**30
CORE, MEM, RATIO, SHARED = names.GPU_CORE, names.GPU_MEMORY, names.GPU_MEMORY_RATIO, names.GPU_SHARED
DOCS = Path(__file__).resolve().parents[2] / "docs" / "translation-rules.md"

# Koordinator's rules, as its source states them.
REMOVE_ZEROS = ("utils.go", "GetPodDeviceRequests",
                "the pod's summed requests go through quotav1.RemoveZeros: a zero quantity counts as not written")
SUM_THEN_CHECK = ("utils.go", "GetPodDeviceRequests",
                  "resourceapi.PodRequests sums the containers (Kubernetes' effective request); "
                  "ValidateDeviceRequest checks only that sum")
COMBINATIONS = ("utils.go", "ValidateDeviceRequest",
                "only listed combinations are valid: gpu-core needs gpu-memory or gpu-memory-ratio, "
                "gpu.shared needs a share, gpu-memory and gpu-memory-ratio never go together")
PERCENT = ("utils.go", "ValidatePercentageResource",
           "gpu-core or gpu-memory-ratio above 100 must be a multiple of 100")
CARDS_FROM_RATIO = ("devicehandler_gpu.go", "calcDesiredRequestsAndCountForGPU",
                    "without gpu.shared the card count is gpu-memory-ratio / 100 when above 100, else 1; "
                    "gpu-core is divided by it, rounded down")
ONE_CARD_FOR_BYTES = ("devicehandler_gpu.go", "calcDesiredRequestsAndCountForGPU",
                      "without gpu.shared or gpu-memory-ratio the count is 1, whatever gpu-core says")
SHARED_MULTIPLES = ("utils.go", "ValidDeviceResourceCombinationsGPUShared",
                    "gpu-core and gpu-memory-ratio must be multiples of gpu.shared and at most 100 per card; "
                    "gpu-memory is not checked")
FLOOR_MEMORY = ("devicehandler_gpu.go", "calcDesiredRequestsAndCountForGPU",
                "each card gets gpu-memory / count, rounded down")

# Why fgpu differs where it does.
NEVER_PLACED = "Koordinator asks for more than 100% of each card, which no card has: the pod stays Pending forever"
OWN_MEMORY = ("fgpu limits each container to its own part of the pod's GPUs (apis/container_split.py); "
              "Koordinator gives every container the whole allocation, so there another container's memory serves it")
NO_BYTES = "Koordinator gives each card 0 bytes of GPU memory"
NO_COMPUTE_LIMIT = ("fgpu limits each container to its own part, and a 0% compute limit means no limit to the isolation "
                    "backends: beside containers with compute, a memory-only container would take the card's whole "
                    "compute (apis/container_split.py)")


@dataclass(frozen=True)
class Rejected:
    """The pod is refused; one error holds every fragment."""

    fragments: tuple[str, ...]


@dataclass(frozen=True)
class Row:
    id: str
    pod: dict[str, Any]
    expected: DeviceRequest | Rejected | None
    rule: tuple[str, str, str]
    #: Why fgpu reads this pod otherwise than Koordinator; empty when it reads it the same.
    differs: str = ""
    #: container_requests: container name -> its own part.
    parts: dict[str, DeviceRequest] = field(default_factory=dict)


def req(gpus: int, core: int, *, memory: int | None = None, ratio: int | None = None, source: str = "koordinator") -> DeviceRequest:
    whole = core == 100 and ratio == 100
    return DeviceRequest(gpus=gpus, core_percent=core, memory_bytes=memory, memory_ratio_percent=ratio, whole=whole, source=source)


def two(a: dict[str, object], b: dict[str, object]) -> dict[str, Any]:
    return pod(container("a", limits=a), container("b", limits=b))


ROWS = [
    # --- zero quantities ---
    Row("zero-core-beside-a-ratio-is-memory-only", limits_pod({CORE: 0, RATIO: 50}), req(1, 0, ratio=50), REMOVE_ZEROS),
    Row("all-zero-asks-for-no-gpu", limits_pod({CORE: 0, RATIO: 0}), None, REMOVE_ZEROS),
    Row("zero-gpu-shared-is-one-card", limits_pod({CORE: 100, RATIO: 100, SHARED: 0}), req(1, 100, ratio=100), REMOVE_ZEROS),
    Row("zero-nvidia-gpu-asks-for-no-gpu", limits_pod({names.NVIDIA_GPU: 0}), None, REMOVE_ZEROS),
    Row("zero-koordinator-gpu-does-not-clash-with-a-share", limits_pod({names.KOORD_GPU: 0, CORE: 50, MEM: "10Gi"}),
        req(1, 50, memory=10 * GI), REMOVE_ZEROS),
    Row("container-with-only-zeros-asks-for-nothing", two({CORE: 50, RATIO: 50}, {CORE: 0, RATIO: "0"}),
        req(1, 50, ratio=50), REMOVE_ZEROS, parts={"a": req(1, 50, ratio=50)}),
    # --- validation after summing the containers ---
    Row("ratios-valid-only-as-a-sum", two({RATIO: 150}, {RATIO: 50}), req(2, 0, ratio=100), SUM_THEN_CHECK,
        parts={"a": req(2, 0, ratio=75), "b": req(2, 0, ratio=25)}),
    Row("core-valid-only-as-a-sum", two({CORE: 150, RATIO: 100}, {CORE: 50, RATIO: 100}), req(2, 100, ratio=100),
        SUM_THEN_CHECK, parts={"a": req(2, 75, ratio=50), "b": req(2, 25, ratio=50)}),
    Row("own-requests-that-do-not-lay-out-are-spread", two({SHARED: 2, CORE: 100, RATIO: 100}, {CORE: 100, RATIO: 100}),
        req(2, 100, ratio=100), SUM_THEN_CHECK, parts={"a": req(2, 50, ratio=50), "b": req(2, 50, ratio=50)}),
    Row("memory-only-containers-keep-their-own-requests", two({MEM: "1Gi"}, {MEM: "2Gi"}), req(1, 0, memory=3 * GI),
        SUM_THEN_CHECK, parts={"a": req(1, 0, memory=GI), "b": req(1, 0, memory=2 * GI)}),
    Row("memory-only-container-beside-compute-is-rejected", two({CORE: 50, MEM: "1Gi"}, {MEM: "1Gi"}),
        Rejected(("container 'b'", "GPU memory only", "no compute limit")), SUM_THEN_CHECK, differs=NO_COMPUTE_LIMIT),
    Row("sum-breaking-a-rule-is-rejected", two({CORE: 60, RATIO: 60}, {CORE: 60, RATIO: 60}),
        Rejected(('containers "a", "b" together', f"{CORE}=120 (sum)", "multiple of 100")), PERCENT),
    Row("memory-and-ratio-from-two-containers-are-rejected", two({CORE: 50, MEM: "1Gi"}, {RATIO: 10}),
        Rejected(("together", "memory and memory-ratio together are invalid")), COMBINATIONS),
    Row("compute-only-container-is-rejected", two({CORE: 50}, {RATIO: 50}),
        Rejected(('container "a"', f"{CORE}=50", "no GPU memory of its own", f"add {RATIO}")), SUM_THEN_CHECK,
        differs=OWN_MEMORY),
    Row("gpu-shared-only-container-is-rejected", two({SHARED: 2}, {CORE: 100, RATIO: 100}),
        Rejected(('container "a"', f"{SHARED}=2", "no GPU memory of its own")), SUM_THEN_CHECK, differs=OWN_MEMORY),
    # --- gpu-core over 100 with gpu-memory-ratio over 100 ---
    Row("core-200-ratio-200-is-two-whole-cards", limits_pod({CORE: 200, RATIO: 200}), req(2, 100, ratio=100), CARDS_FROM_RATIO),
    Row("core-200-ratio-300-is-three-cards-of-66", limits_pod({CORE: 200, RATIO: 300}), req(3, 66, ratio=100), CARDS_FROM_RATIO),
    Row("core-100-ratio-200-is-half-the-compute-of-two-cards", limits_pod({CORE: 100, RATIO: 200}), req(2, 50, ratio=100),
        CARDS_FROM_RATIO),
    Row("core-50-ratio-200-is-a-quarter-of-two-cards", limits_pod({CORE: 50, RATIO: 200}), req(2, 25, ratio=100),
        CARDS_FROM_RATIO),
    Row("core-300-over-ratio-200-is-rejected", limits_pod({CORE: 300, RATIO: 200}),
        Rejected((f"{CORE}=300", "more than 100 per card", "spans 2 card(s)", "at most 200")), CARDS_FROM_RATIO,
        differs=NEVER_PLACED),
    Row("core-200-over-ratio-50-is-rejected", limits_pod({CORE: 200, RATIO: 50}),
        Rejected((f"{CORE}=200", "more than 100 per card", "spans 1 card(s)")), CARDS_FROM_RATIO, differs=NEVER_PLACED),
    Row("core-150-is-rejected", limits_pod({CORE: 150, RATIO: 200}), Rejected((f"{CORE}=150", "multiple of 100")), PERCENT),
    # --- gpu-core: 300 with gpu-memory in bytes ---
    Row("core-300-memory-30Gi-is-three-cards-of-10Gi", limits_pod({CORE: 300, MEM: "30Gi"}), req(3, 100, memory=10 * GI),
        ONE_CARD_FOR_BYTES, differs=NEVER_PLACED),
    Row("core-300-memory-10Gi-rounds-each-card-down", limits_pod({CORE: 300, MEM: "10Gi"}), req(3, 100, memory=10 * GI // 3),
        ONE_CARD_FOR_BYTES, differs=NEVER_PLACED),
    Row("core-50-memory-30Gi-is-one-card", limits_pod({CORE: 50, MEM: "30Gi"}), req(1, 50, memory=30 * GI), ONE_CARD_FOR_BYTES),
    # --- gpu.shared with memory the card count does not divide ---
    Row("shared-3-memory-10Gi-rounds-each-card-down", limits_pod({SHARED: 3, CORE: 300, MEM: "10Gi"}),
        req(3, 100, memory=10 * GI // 3), FLOOR_MEMORY),
    Row("shared-3-memory-only-rounds-each-card-down", limits_pod({SHARED: 3, MEM: "10Gi"}), req(3, 0, memory=10 * GI // 3),
        SHARED_MULTIPLES),
    Row("shared-2-memory-1-byte-is-rejected", limits_pod({SHARED: 2, MEM: "1"}),
        Rejected((f"{MEM}=1", "less than one byte for each of 2 cards")), FLOOR_MEMORY, differs=NO_BYTES),
    Row("shared-2-core-75-is-rejected", limits_pod({SHARED: 2, CORE: 75, RATIO: 100}),
        Rejected((f"{CORE}=75", f"multiple of {SHARED}=2")), SHARED_MULTIPLES),
]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_fgpu_reads_the_pod_as_the_row_says(row: Row) -> None:
    if isinstance(row.expected, Rejected):
        with pytest.raises(RequestError) as caught:
            parse_pod(row.pod)
        assert any(all(f in e for f in row.expected.fragments) for e in caught.value.errors), caught.value.errors
        with pytest.raises(RequestError):
            container_requests(row.pod)
        return
    assert parse_pod(row.pod) == row.expected
    if row.parts:
        assert {c.name: c.request for c in container_requests(row.pod)} == row.parts


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_each_row_cites_a_koordinator_rule(row: Row) -> None:
    file, function, words = row.rule
    assert file in ("utils.go", "devicehandler_gpu.go") and function[0].isalpha() and words


def test_every_deliberate_difference_is_documented() -> None:
    section = DOCS.read_text().split("## Differences from Koordinator", 1)[1]
    for needle in ("gpu-core: 300", "gpu-memory: 30Gi", "no GPU memory", "Pending", "0 bytes", "no compute limit"):
        assert needle in section


def _allocation(request: DeviceRequest, gpu_memory: int) -> Allocation:
    memory = gpu_memory if request.whole else request.memory_bytes_on(gpu_memory)
    ratio = request.memory_ratio_percent or min(100, -(-memory * 100 // gpu_memory))
    return Allocation(gpus=tuple(
        GPUShare(minor=i, uuid=f"GPU-{i}", core_percent=request.core_percent, memory_bytes=memory, memory_ratio_percent=ratio)
        for i in range(request.gpus)
    ))


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS if isinstance(r.expected, DeviceRequest)])
def test_the_containers_parts_of_every_accepted_pod_lay_out_on_its_gpus(row: Row) -> None:
    assert isinstance(row.expected, DeviceRequest)
    allocation = _allocation(row.expected, 80 * GI)
    split = split_allocation(allocation, container_requests(row.pod), gpu_memory={g.uuid: 80 * GI for g in allocation.gpus})
    assert all(share.containers for share in split.gpus)


amount = st.sampled_from([0, 0, 25, 50, 60, 75, 100, 150, 200, 300])
koordinator_limits = st.fixed_dictionaries({}, optional={
    CORE: amount, RATIO: amount, SHARED: st.sampled_from([0, 1, 2, 3]), MEM: st.sampled_from(["0", "1Gi", "10Gi", "7"]),
})


@given(st.lists(koordinator_limits, min_size=1, max_size=3), st.lists(koordinator_limits, max_size=2))
def test_any_accepted_pod_has_container_parts_that_lay_out_on_its_gpus(
    apps: list[dict[str, object]], inits: list[dict[str, object]]
) -> None:
    manifest = pod(*(container(f"c{i}", limits=lim) for i, lim in enumerate(apps)),
                   init=[container(f"i{i}", limits=lim) for i, lim in enumerate(inits)])
    try:
        request = parse_pod(manifest)
    except RequestError:
        with pytest.raises(RequestError):
            container_requests(manifest)
        return
    parts = container_requests(manifest)
    if request is None:
        assert parts == []
        return
    for gpu_memory in (80 * GI, 24 * GI + 7):
        allocation = _allocation(request, gpu_memory)
        split_allocation(allocation, parts, gpu_memory={g.uuid: gpu_memory for g in allocation.gpus})
