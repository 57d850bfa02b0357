"""filter() explains thousands of nodes in bulk; every verdict must equal the node explained alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from apis.allocation import Allocation, GPUShare
from apis.request import DeviceRequest
from scheduler_plugin.core.api import LabelRequirement, NodeName, PodRequest
from scheduler_plugin.core.scheduler import Scheduler
from tests.scheduler_core.builders import GiB, gpu, info, node, pod, share, whole


def _varied_cluster() -> Scheduler:
    scheduler = Scheduler()
    layouts = [
        node("plain-a", 8),
        node("plain-b", 4, model="T4", memory_gib=16),
        node("busy", 3),
        node("sick", 8, unhealthy=[0, 1, 2, 3, 4, 5]),
        node("held", 2, external=[0, 1]),
        node("broken", 0, discovery_error="NVML: driver not loaded"),
        node("empty", 0),
        node("mig", gpus=[gpu("mig", 0, mig=[("1g.10gb", 10)]), gpu("mig", 1)]),
        node("mixed", gpus=[gpu("mixed", 0, model="T4", memory_gib=16), gpu("mixed", 1)]),
        node("islands", gpus=[gpu("islands", i, nvlink_to=[i ^ 1]) for i in range(4)]),
    ]
    for devices in layouts:
        scheduler.upsert_node_devices(devices)
        scheduler.upsert_node_info(
            info(
                devices.node_name,
                cpu=8000,
                memory_gib=64,
                labels={"pool": "a" if "a" in devices.node_name else "b"},
            )
        )
    scheduler.upsert_node_info(info("cpu-only", cpu=4000, memory_gib=16))
    for name, minors, core, gib in (
        ("plain-a", (0, 1, 2), 60, 50),
        ("plain-b", (0,), 100, 16),
        ("islands", (0,), 10, 1),
        ("mixed", (1,), 50, 40),
        ("busy", (0, 1), 70, 70),
        ("busy", (2,), 95, 10),
    ):
        shares = tuple(GPUShare(m, f"GPU-{name}-{m}", core, gib * GiB, 0) for m in minors)
        holder = pod(f"held-{name}-{core}", cpu=3000 if core != 95 else 0, memory_gib=8 if core != 95 else 0)
        scheduler.add_pod(holder, NodeName(name), Allocation(gpus=shares))
    return scheduler


CLUSTER = _varied_cluster()

devices = st.one_of(
    st.none(),
    st.builds(
        lambda core, gib, cards: share(core, gib=gib, cards=cards),
        st.sampled_from([0, 10, 50, 100]),
        st.sampled_from([1, 8, 20, 60, 90]),
        st.integers(1, 3),
    ),
    st.builds(
        lambda core, ratio: share(core, ratio=ratio), st.sampled_from([10, 50]), st.sampled_from([25, 60])
    ),
    st.builds(whole, st.integers(1, 8)),
)


@st.composite
def requests(draw: st.DrawFn) -> PodRequest:
    device: DeviceRequest | None = draw(devices)
    return pod(
        "p",
        device,
        cpu=draw(st.sampled_from([0, 1000, 6000, 9000])),
        memory_gib=draw(st.sampled_from([0, 8, 60, 100])),
        use=draw(st.sampled_from([(), ("T4",), ("A100-SXM4-80GB",)])),
        avoid=draw(st.sampled_from([(), ("T4",)])),
        scope=draw(st.sampled_from(["", "nvlink", "pcie"])),
        selector=draw(st.sampled_from([{}, {"pool": "a"}])),
        affinity=draw(st.sampled_from([(), ((LabelRequirement("pool", "NotIn", ("b",)),),)])),
    )


@settings(max_examples=150, deadline=None)
@given(request=requests())
def test_every_bulk_verdict_equals_the_node_explained_alone(request: PodRequest) -> None:
    names = [NodeName(n) for n in sorted(CLUSTER.state.slot_of)] + [NodeName("ghost")]
    for verdict in CLUSTER.filter(request, names):
        assert verdict == CLUSTER.explain_node(request, verdict.node_name)
