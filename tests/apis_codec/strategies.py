"""Hypothesis strategies for the values apis/ encodes."""

from __future__ import annotations

from hypothesis import strategies as st

from apis.allocation import Allocation, GPUShare
from apis.devices import ExternalHolder, GPUInfo, MIGInstance, NodeDevices, NVLinkPeer, Topology

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
NON_NEGATIVE_INT32 = st.integers(min_value=0, max_value=2**31 - 1)
UINT32 = st.integers(min_value=0, max_value=2**32 - 1)
UINT64 = st.integers(min_value=0, max_value=2**64 - 1)
PERCENT = st.integers(min_value=0, max_value=100)

gpu_shares = st.builds(
    GPUShare,
    minor=st.integers(min_value=0, max_value=2**31 - 1),
    uuid=st.text(),
    core_percent=PERCENT,
    memory_bytes=st.integers(min_value=0, max_value=2**63),
    memory_ratio_percent=PERCENT,
    mig_uuid=st.text(),
)
allocations = st.builds(Allocation, gpus=st.lists(gpu_shares, max_size=8).map(tuple))

nvlink_peers = st.builds(NVLinkPeer, bus_id=st.text(), uuid=st.text(), links=INT32)
topologies = st.builds(
    Topology,
    numa_node=INT32,
    socket_id=INT32,
    pcie_root=st.text(),
    bus_id=st.text(),
    nvlink_peers=st.lists(nvlink_peers, max_size=3).map(tuple),
)
mig_instances = st.builds(
    MIGInstance,
    uuid=st.text(),
    profile=st.text(),
    memory_bytes=UINT64,
    slices=INT32,
    gpu_instance_id=INT32,
    compute_instance_id=INT32,
    index=INT32,
)


@st.composite
def node_devices(draw: st.DrawFn) -> NodeDevices:
    """Any inventory both wire forms can carry: GPU UUIDs are non-empty and distinct, as NVML's are."""
    uuids = draw(st.lists(st.text(min_size=1), max_size=4, unique=True))
    gpus = tuple(
        GPUInfo(
            uuid=uuid,
            minor=draw(NON_NEGATIVE_INT32),
            index=draw(INT32),
            model=draw(st.text()),
            model_label=draw(st.text()),
            memory_bytes=draw(st.integers(min_value=0, max_value=2**63 - 1)),
            healthy=draw(st.booleans()),
            health_reason=draw(st.text()),
            topology=draw(topologies),
            vendor=draw(st.text()),
            mig_enabled=draw(st.booleans()),
            mig_instances=tuple(draw(st.lists(mig_instances, max_size=3))),
            power_limit_watts=draw(UINT32),
        )
        for uuid in uuids
    )
    holders = st.builds(
        ExternalHolder, gpu_uuid=st.text(), pod_uid=st.text(), container_name=st.text(), resource_name=st.text()
    )
    return NodeDevices(
        node_name=draw(st.text(min_size=1)),
        gpus=gpus,
        driver_version=draw(st.text()),
        cuda_driver_version=draw(st.text()),
        external_holders=tuple(draw(st.lists(holders, max_size=3))),
        discovery_error=draw(st.text()),
    )
