"""Filter: which nodes fit, and the reason a person reads for those that don't."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from apis.allocation import Allocation, GPUShare
from scheduler_plugin.core.api import LabelRequirement, NodeName, PodRequest, PodUID
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import GiB, gpu, info, node, pod, share, whole


def _occupy(core: int, gib: int, *gpus: int, node_name: str = "n1") -> Callable[[Scheduler], object]:
    """Binds a pod holding `core`% and `gib` GiB on each listed GPU of the node."""

    def apply(scheduler: Scheduler) -> None:
        shares = tuple(GPUShare(i, f"GPU-{node_name}-{i}", core, gib * GiB, 0) for i in gpus)
        holder = pod(f"holder-{core}-{gib}-{'-'.join(map(str, gpus))}")
        scheduler.add_pod(holder, NodeName(node_name), Allocation(gpus=shares))

    return apply


@dataclass(frozen=True)
class Case:
    name: str
    pod: PodRequest
    setup: tuple[Callable[[Scheduler], object], ...]
    feasible: bool
    reason: str = ""
    unresolvable: bool = False


def _devices(*args: object, **kwargs: object) -> Callable[[Scheduler], object]:
    return lambda s: s.upsert_node_devices(node("n1", *args, **kwargs))  # type: ignore[arg-type]


def _info(**kwargs: object) -> Callable[[Scheduler], object]:
    return lambda s: s.upsert_node_info(info("n1", **kwargs))  # type: ignore[arg-type]


# Two NVLink islands of four GPUs each (0-3 and 4-7), as a matrix the agent reports.
_ISLANDS = [
    gpu("n1", i, nvlink_to=[j for j in range(4 * (i // 4), 4 * (i // 4) + 4) if j != i]) for i in range(8)
]

CASES = [
    Case("a share fits an empty node", pod("p", share(50, gib=20)), (_devices(8),), True),
    Case(
        "too few healthy GPUs for whole cards",
        pod("p", whole(4)),
        (_devices(8, unhealthy=[0, 1, 2, 3, 4, 5]),),
        False,
        "2 of 8 GPUs healthy, pod needs 4 whole GPUs (GPU 0: XID 79; GPU 1: XID 79; GPU 2: XID 79; 3 more)",
        True,
    ),
    Case(
        "a model outside the use list",
        pod("p", share(10), use=["A100-SXM4-80GB"]),
        (_devices(4, model="T4", memory_gib=16),),
        False,
        "model T4 not in use list [A100-SXM4-80GB]",
        True,
    ),
    Case(
        "a model on the avoid list",
        pod("p", share(10), avoid=["T4"]),
        (_devices(4, model="T4", memory_gib=16),),
        False,
        "model T4 in avoid list [T4]",
        True,
    ),
    Case(
        "not enough cpu left",
        pod("p", share(10), cpu=4000),
        (_devices(8), _info(cpu=8000), lambda s: s.add_pod(pod("busy", cpu=6000), NodeName("n1"), None)),
        False,
        "insufficient cpu: 2000m free, pod needs 4000m",
        False,
    ),
    Case(
        "more cpu than the node has at all",
        pod("p", None, cpu=16000),
        (_info(cpu=8000),),
        False,
        "insufficient cpu: 8000m free, pod needs 16000m",
        True,
    ),
    Case(
        "not enough host memory left",
        pod("p", None, memory_gib=64),
        (_info(memory_gib=32),),
        False,
        "insufficient memory: 32Gi free, pod needs 64Gi",
        True,
    ),
    Case("a cpu-only pod fits a node without GPUs", pod("p", None, cpu=1000), (_info(),), True),
    Case(
        "a GPU pod on a node without a Device report",
        pod("p", share(10)),
        (_info(),),
        False,
        "node has no Device report",
        True,
    ),
    Case(
        "a GPU pod on a node whose discovery failed",
        pod("p", share(10)),
        (_devices(0, discovery_error="NVML: driver not loaded"),),
        False,
        "GPU discovery failed on the node: NVML: driver not loaded",
        True,
    ),
    Case(
        "fewer GPUs than whole cards asked",
        pod("p", whole(4)),
        (_devices(2),),
        False,
        "node has 2 GPUs, pod needs 4 whole GPUs",
        True,
    ),
    Case(
        "whole cards need entirely free GPUs",
        pod("p", whole(4)),
        (_devices(8), _occupy(10, 1, 0, 1, 2, 3, 4)),
        False,
        "3 of 8 GPUs fully free, pod needs 4 whole GPUs",
        False,
    ),
    Case(
        "a share bigger than any GPU's memory",
        pod("p", share(10, gib=90)),
        (_devices(8),),
        False,
        "pod needs 90Gi GPU memory per card, largest GPU here has 80Gi",
        True,
    ),
    Case(
        "a share when every GPU is too busy",
        pod("p", share(50, gib=20)),
        (_devices(2), _occupy(60, 10, 0), _occupy(30, 70, 1)),
        False,
        "no GPU has 50% core and 20Gi memory free for 1 GPU share of 50% core and 20Gi (most free: GPU 1 with 70% core, 10Gi)",
        False,
    ),
    Case(
        "a memory ratio is measured against the GPU's own size",
        pod("p", share(10, ratio=50)),
        (_devices(1, memory_gib=16), _occupy(10, 9, 0)),
        False,
        "no GPU has 10% core and 8Gi memory free",
        False,
    ),
    Case(
        "a memory ratio fits what is left",
        pod("p", share(10, ratio=50)),
        (_devices(1, memory_gib=16), _occupy(10, 8, 0)),
        True,
    ),
    Case(
        "GPUs held outside fgpu count as fully used",
        pod("p", whole(1)),
        (_devices(2, external=[0, 1]),),
        False,
        "0 of 2 healthy GPUs usable (2 held outside fgpu), pod needs 1 whole GPU",
        False,
    ),
    Case(
        "a required NVLink scope needs the GPUs inside one island",
        pod("p", whole(4), scope="nvlink"),
        (lambda s: s.upsert_node_devices(node("n1", gpus=_ISLANDS)), _occupy(10, 1, 0, 4)),
        False,
        "no NVLink group has 4 fully free GPUs (most in one NVLink group: 3), pod requires topology scope nvlink",
        False,
    ),
    Case(
        "without a scope the same GPUs are fine",
        pod("p", whole(4)),
        (lambda s: s.upsert_node_devices(node("n1", gpus=_ISLANDS)), _occupy(10, 1, 0, 4)),
        True,
    ),
    Case(
        "a nodeSelector the node does not match",
        pod("p", share(10), selector={"pool": "train"}),
        (_devices(8), _info(labels={"pool": "infer"})),
        False,
        "node has pool=infer, pod's nodeSelector needs pool=train",
        True,
    ),
    Case(
        "a nodeSelector the node matches",
        pod("p", share(10), selector={"pool": "train"}),
        (_devices(8), _info(labels={"pool": "train"})),
        True,
    ),
    Case(
        "node affinity with no matching term",
        pod("p", share(10), affinity=[[LabelRequirement("zone", "In", ("a", "b"))]]),
        (_devices(8), _info(labels={"zone": "c"})),
        False,
        "node matches none of the pod's required node affinity terms (unmet: zone In ['a', 'b'])",
        True,
    ),
    Case(
        "node affinity: any one term is enough",
        pod(
            "p",
            share(10),
            affinity=[[LabelRequirement("zone", "In", ("a",))], [LabelRequirement("gen", "Gt", ("3",))]],
        ),
        (_devices(8), _info(labels={"zone": "c", "gen": "4"})),
        True,
    ),
    Case(
        "node affinity NotIn matches a node without the label",
        pod("p", share(10), affinity=[[LabelRequirement("spot", "NotIn", ("true",))]]),
        (_devices(8), _info(labels={})),
        True,
    ),
    Case(
        "node affinity on the node name (matchFields)",
        pod("p", share(10), affinity=[[LabelRequirement("metadata.name", "In", ("n2",))]]),
        (_devices(8),),
        False,
        "unmet: metadata.name In ['n2']",
        True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_filter_decides_and_explains(case: Case) -> None:
    scheduler = Scheduler()
    for step in case.setup:
        step(scheduler)
    [verdict] = scheduler.filter(case.pod, [NodeName("n1")])
    assert verdict.feasible is case.feasible, verdict.reason
    if not case.feasible:
        assert case.reason in verdict.reason
        assert verdict.unresolvable is case.unresolvable
    # select and reserve agree with filter
    assert (scheduler.select(case.pod, [NodeName("n1")]) is not None) is case.feasible


def test_filter_reports_unknown_nodes_by_name() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("n1"))
    verdicts = scheduler.filter(pod("p", share(10)), [NodeName("n1"), NodeName("ghost")])
    assert [v.feasible for v in verdicts] == [True, False]
    assert "not known to the fgpu scheduler" in verdicts[1].reason
    assert verdicts[1].unresolvable


def test_filter_without_a_node_list_covers_every_known_node_in_name_order() -> None:
    scheduler = Scheduler()
    for name in ("b", "c", "a"):
        scheduler.upsert_node_devices(node(name, 1))
    assert [v.node_name for v in scheduler.filter(pod("p", share(10)))] == ["a", "b", "c"]


def test_an_invalid_topology_scope_is_an_error_not_a_verdict() -> None:
    scheduler = Scheduler()
    scheduler.upsert_node_devices(node("n1"))
    bad = PodRequest(uid=PodUID("u"), namespace="d", name="p", device=whole(2), topology_scope="rack")
    with pytest.raises(Exception, match="topology scope 'rack'"):
        scheduler.filter(bad)
