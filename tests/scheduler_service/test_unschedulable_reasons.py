"""fgpu_scheduler_unschedulable_reasons_total: a fixed set of reason kinds, never the pod's own text.

The reasons come from the real core (filtering nodes that fail for one reason each); the label is
what /metrics would show. A pod author writes its model lists, nodeSelector and job name; none of
that may become a label value, or each edit of a pending pod adds a series for good.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apis import names
from scheduler_plugin.core.api import NodeInfo, NodeName
from scheduler_plugin.core.noderules import NodeRules, Taint
from scheduler_plugin.metrics import Metrics, ReasonKind, reason_kind
from scheduler_plugin.scheduling import SchedulingService
from tests.scheduler_service.builders import gpu_node, share_pod, whole_pod

Build = Callable[[], SchedulingService]
METRIC = "fgpu_scheduler_unschedulable_reasons"


def counted(metrics: Metrics) -> dict[str, float]:
    """reason label -> count, as a scrape reads them (zero series left out)."""
    families = text_string_to_metric_families(metrics.exposition().decode())
    return {
        s.labels["reason"]: s.value
        for family in families
        if family.name == METRIC
        for s in family.samples
        if s.name == f"{METRIC}_total" and s.value
    }


def exported_reasons(metrics: Metrics) -> set[str]:
    families = text_string_to_metric_families(metrics.exposition().decode())
    return {s.labels["reason"] for f in families if f.name == METRIC for s in f.samples if s.name == f"{METRIC}_total"}


@pytest.fixture
def service(embedded_service: Build) -> SchedulingService:
    built = embedded_service()
    built.report_devices(gpu_node("h100", gpus=2))
    built.report_devices(gpu_node("sick", gpus=2, unhealthy=(0, 1)))
    built.report_devices(gpu_node("tainted", gpus=2))
    built.on_node(NodeInfo(NodeName("tainted"), rules=NodeRules(taints=(Taint("dedicated", "infer"),))))
    built.report_devices(gpu_node("cordoned", gpus=2))
    built.on_node(
        NodeInfo(NodeName("cordoned"), rules=NodeRules(taints=(Taint(names.TAINT_UNSCHEDULABLE, cause="node is cordoned (spec.unschedulable)"),)))
    )
    built.report_devices(gpu_node("labelled", gpus=2))
    built.on_node(NodeInfo(NodeName("labelled"), labels={"pool": "training"}))
    return built


def with_selector(p: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    p["spec"]["nodeSelector"] = selector
    return p


CASES = [
    ("unknown node", whole_pod("p"), "nope", ReasonKind.UNKNOWN_NODE),
    ("model use list", share_pod("p", annotations={names.GPU_MODEL_USE: "T4"}), "h100", ReasonKind.GPU_MODEL),
    ("model avoid list", share_pod("p", annotations={names.GPU_MODEL_AVOID: "H100-80GB-HBM3"}), "h100", ReasonKind.GPU_MODEL),
    ("more GPUs than the node has", whole_pod("p", gpus=4), "h100", ReasonKind.TOO_FEW_GPUS),
    ("more memory than a card has", share_pod("p", core=10, memory="100Gi"), "h100", ReasonKind.GPU_MEMORY_TOO_SMALL),
    ("unhealthy GPUs", whole_pod("p"), "sick", ReasonKind.GPUS_UNHEALTHY),
    ("untolerated taint", whole_pod("p"), "tainted", ReasonKind.TAINT),
    ("cordoned node", whole_pod("p"), "cordoned", ReasonKind.NODE_CORDONED),
    ("nodeSelector", with_selector(whole_pod("p"), {"pool": "inference"}), "labelled", ReasonKind.NODE_SELECTOR),
]


@pytest.mark.parametrize(("the_pod", "node", "kind"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_rejection_is_counted_under_its_kind(service: SchedulingService, the_pod: dict[str, Any], node: str, kind: ReasonKind) -> None:
    outcome = service.filter(the_pod, [node])

    assert [v.feasible for v in outcome.verdicts] == [False]
    assert counted(service.metrics) == {kind.value: 1}, outcome.verdicts[0].reason


def test_busy_gpus_are_counted_as_busy_for_whole_gpus_and_for_shares(service: SchedulingService) -> None:
    service.bind(whole_pod("fills", gpus=2), "h100")

    service.filter(whole_pod("whole"), ["h100"])
    service.filter(share_pod("share", core=10, memory="1Gi"), ["h100"])

    assert counted(service.metrics) == {ReasonKind.GPUS_BUSY.value: 1, ReasonKind.GPU_SHARE_BUSY.value: 1}


def test_a_filter_of_many_nodes_counts_each_rejected_node(service: SchedulingService) -> None:
    service.filter(whole_pod("p", gpus=4), ["h100", "labelled", "nope"])

    assert counted(service.metrics) == {ReasonKind.TOO_FEW_GPUS.value: 2, ReasonKind.UNKNOWN_NODE.value: 1}


HOSTILE = ["review-model-alpha", 'x"} 1\nfake_metric{a="', "node has taint", "ü" * 300, "job x runs on model y; node has z"]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_no_text_a_pod_writes_becomes_a_label_value(service: SchedulingService, text: str) -> None:
    before = exported_reasons(service.metrics)
    hostile = [
        share_pod("a", annotations={names.GPU_MODEL_USE: text}),
        share_pod("b", annotations={names.GPU_MODEL_AVOID: f"H100-80GB-HBM3,{text}"}),
        with_selector(whole_pod("c"), {"pool": text, text: "v"}),
        share_pod("d", annotations={names.JOB_KEY: text}),
    ]

    for p in hostile:
        service.filter(p, ["h100", "labelled", "tainted"])

    assert exported_reasons(service.metrics) == before == {kind.value for kind in ReasonKind}


WORDS = [
    ("node is not known to the fgpu scheduler (no Node object or Device report seen)", ReasonKind.UNKNOWN_NODE),
    ("node has no label pool, pod's nodeSelector needs pool=a", ReasonKind.NODE_SELECTOR),
    ("node matches none of the pod's required node affinity terms (unmet: zone In ['a'])", ReasonKind.NODE_AFFINITY),
    ("node has taint dedicated=infer:NoSchedule the pod does not tolerate", ReasonKind.TAINT),
    ("node is not ready (condition Ready=False)", ReasonKind.NODE_NOT_READY),
    ("node is unreachable (condition Ready=Unknown)", ReasonKind.NODE_NOT_READY),
    ("node's network is unavailable (condition NetworkUnavailable=True)", ReasonKind.NODE_NOT_READY),
    ("host port 8080/TCP is in use on the node", ReasonKind.HOST_PORT),
    ("too many pods: 110 of 110 allowed (status.allocatable.pods)", ReasonKind.TOO_MANY_PODS),
    ("node cannot enforce GPU share limits (condition FgpuIsolationReady=False, X); whole GPUs still fit there",
     ReasonKind.GPU_LIMITS_UNENFORCED),
    ("insufficient cpu: 500m free, pod needs 1000m", ReasonKind.INSUFFICIENT_CPU),
    ("insufficient memory: 1Gi free, pod needs 2Gi", ReasonKind.INSUFFICIENT_MEMORY),
    ("node has no Device report (is the fgpu agent running there?)", ReasonKind.NO_DEVICE_REPORT),
    ("GPU discovery failed on the node: NVML_ERROR_DRIVER_NOT_LOADED", ReasonKind.GPU_DISCOVERY_FAILED),
    ("node has no GPUs", ReasonKind.NO_GPUS),
    ("job ml/train runs on model A100; node has T4", ReasonKind.GPU_MODEL),
    ("pod asks for a MIG instance (fgpu.io/gpu-mode=mig) for 1 GPU share of 10Gi, but no GPU here is in MIG mode",
     ReasonKind.NO_MIG_GPU),
    ("1 of 2 healthy GPUs usable (1 held outside fgpu), pod needs 2 whole GPUs", ReasonKind.GPUS_NOT_USABLE),
    ("no free MIG instance holds 1 GPU share of 10Gi (free instances: none) and ...", ReasonKind.NO_MIG_INSTANCE),
    ("2 of 8 GPUs can take a card, pod needs 4 GPU shares of 50% core each (most free: GPU 1 with 60% core, 4Gi)",
     ReasonKind.GPU_SHARE_BUSY),
    ("1 GPU share of 10Gi asks for GPU memory only, so it would run with no compute limit (...); every GPU here ...",
     ReasonKind.MEMORY_ONLY_SHARE),
    ("the GPUs here with room for 1 GPU share of 50% core and 10Gi (GPU 0) hold another pod's memory-only share, ...",
     ReasonKind.MEMORY_ONLY_SHARE),
    ("node takes no burstable GPU share (no valid label on the node: its pool does not allow overcommit)",
     ReasonKind.BURSTABLE_RATIO),
    ("no GPU here keeps the burstable limits within 2 x what the guaranteed shares leave free", ReasonKind.BURSTABLE_RATIO),
    ("no GPU model has 4 fitting GPUs (A100: 2, H100: 2); all cards of a pod are of one model", ReasonKind.MIXED_MODELS),
    ("no NVLink group has 4 fully free GPUs (most in one NVLink group: 2), pod requires topology scope nvlink",
     ReasonKind.TOPOLOGY),
    ("pod needs what standalone mode does not check", ReasonKind.STANDALONE_UNCHECKED),
    ("node cannot take 1 GPU share of 50% core", ReasonKind.OTHER),
    ("review-model-alpha", ReasonKind.OTHER),
    ("", ReasonKind.OTHER),
]


@pytest.mark.parametrize(("words", "kind"), WORDS, ids=[w[:40] for w, _ in WORDS])
def test_the_cores_words_read_as_their_kind(words: str, kind: ReasonKind) -> None:
    assert reason_kind(words) is kind
