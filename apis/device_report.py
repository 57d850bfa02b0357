"""`NodeDevices` in its gRPC form: the `fgpu.v1.NodeDeviceReport` of ReportDevices, both ways."""

from __future__ import annotations

from apis.fgpu.v1 import device_pb2
from apis.inventory import ExternalHolder, GPUInfo, MIGInstance, NodeDevices, NVLinkPeer, Topology


def to_proto(devices: NodeDevices) -> device_pb2.NodeDeviceReport:
    """The ReportDevices form of `devices` (observed_at and usage are the caller's to fill)."""
    return device_pb2.NodeDeviceReport(
        node_name=devices.node_name,
        gpus=[_gpu_to_proto(g) for g in devices.gpus],
        driver_version=devices.driver_version,
        cuda_driver_version=devices.cuda_driver_version,
        external_holders=[
            device_pb2.ExternalHolder(
                gpu_uuid=h.gpu_uuid, pod_uid=h.pod_uid, container_name=h.container_name, resource_name=h.resource_name
            )
            for h in devices.external_holders
        ],
        discovery_error=devices.discovery_error,
    )


def from_proto(report: device_pb2.NodeDeviceReport) -> NodeDevices:
    """`NodeDevices` from a report; a GPU whose health is unspecified counts as unhealthy."""
    return NodeDevices(
        node_name=report.node_name,
        gpus=tuple(_gpu_from_proto(g) for g in report.gpus),
        driver_version=report.driver_version,
        cuda_driver_version=report.cuda_driver_version,
        external_holders=tuple(
            ExternalHolder(
                gpu_uuid=h.gpu_uuid, pod_uid=h.pod_uid, container_name=h.container_name, resource_name=h.resource_name
            )
            for h in report.external_holders
        ),
        discovery_error=report.discovery_error,
    )


def _gpu_to_proto(gpu: GPUInfo) -> device_pb2.GPU:
    topo = gpu.topology
    return device_pb2.GPU(
        uuid=gpu.uuid,
        minor=gpu.minor,
        index=gpu.index,
        vendor=gpu.vendor,
        model=gpu.model,
        model_label=gpu.model_label,
        memory_bytes=gpu.memory_bytes,
        health=device_pb2.HEALTHY if gpu.healthy else device_pb2.UNHEALTHY,
        health_reason=gpu.health_reason,
        topology=device_pb2.Topology(
            numa_node=topo.numa_node,
            socket_id=topo.socket_id,
            pcie_root=topo.pcie_root,
            bus_id=topo.bus_id,
            nvlink_peers=[device_pb2.NVLinkPeer(bus_id=p.bus_id, uuid=p.uuid, links=p.links) for p in topo.nvlink_peers],
        ),
        mig_enabled=gpu.mig_enabled,
        mig_instances=[
            device_pb2.MIGInstance(
                uuid=m.uuid,
                profile=m.profile,
                memory_bytes=m.memory_bytes,
                slices=m.slices,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
                index=m.index,
            )
            for m in gpu.mig_instances
        ],
    )


def _gpu_from_proto(gpu: device_pb2.GPU) -> GPUInfo:
    topo = gpu.topology
    return GPUInfo(
        uuid=gpu.uuid,
        minor=gpu.minor,
        index=gpu.index,
        model=gpu.model,
        model_label=gpu.model_label,
        memory_bytes=gpu.memory_bytes,
        healthy=gpu.health == device_pb2.HEALTHY,
        health_reason=gpu.health_reason,
        topology=Topology(
            # An unset topology message reads as zeros; -1 is the "unknown" the dataclass uses.
            numa_node=topo.numa_node if gpu.HasField("topology") else -1,
            socket_id=topo.socket_id if gpu.HasField("topology") else -1,
            pcie_root=topo.pcie_root,
            bus_id=topo.bus_id,
            nvlink_peers=tuple(NVLinkPeer(bus_id=p.bus_id, uuid=p.uuid, links=p.links) for p in topo.nvlink_peers),
        ),
        vendor=gpu.vendor,
        mig_enabled=gpu.mig_enabled,
        mig_instances=tuple(
            MIGInstance(
                uuid=m.uuid,
                profile=m.profile,
                memory_bytes=m.memory_bytes,
                slices=m.slices,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
                index=m.index,
            )
            for m in gpu.mig_instances
        ),
    )
