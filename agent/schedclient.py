"""Streams the node's report to the scheduler service (ReportDevices), for setups that use its own state.

The report is sent when the devices changed since the last accepted one, and
on every resync anyway, so a scheduler that restarted and lost its state has
it back within a resync period.

Only a scheduler with the embedded state backend takes reports; one on the
kubernetes backend refuses them (PERMISSION_DENIED): there a node's GPUs come
only from its Device object. A scheduler on TCP beyond loopback listens only
with mutual TLS, so `tls` then carries this agent's certificate and key and
the CA of the scheduler's certificate (agent config `schedulerTLS`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from agent.errors import SchedulerUnavailable
from agent.usage import GPUUsage
from apis import tls
from apis.devices import NodeDevices, to_proto
from apis.fgpu.v1 import device_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)


def report_message(devices: NodeDevices, usage: Sequence[GPUUsage], *, now: float) -> device_pb2.NodeDeviceReport:
    report = to_proto(devices)
    stamp = Timestamp()
    stamp.FromNanoseconds(int(now * 1e9))
    report.observed_at.CopyFrom(stamp)
    for u in usage:
        report.usage.append(
            device_pb2.GPUUsage(
                uuid=u.uuid,
                sm_utilization_percent=u.sm_utilization_percent,
                memory_used_bytes=u.memory_used_bytes,
                processes=[
                    device_pb2.ProcessUsage(
                        pid=p.pid, pod_uid=p.pod_uid, container_id=p.container_id, used_memory_bytes=p.used_memory_bytes
                    )
                    for p in u.processes
                ],
            )
        )
    return report


class SchedulerReporter:
    def __init__(self, address: str, *, tls_files: tls.TLSFiles = tls.TLSFiles(), timeout_s: float = 5.0) -> None:
        self._address = address
        self._channel = tls.grpc_channel(address, tls_files, field="--scheduler")
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)  # type: ignore[no-untyped-call]
        self._timeout = timeout_s
        self._last: NodeDevices | None = None

    def report(self, devices: NodeDevices, usage: Sequence[GPUUsage], *, force: bool) -> bool:
        """Sends when `devices` changed or `force`; True when it sent."""
        if not force and devices == self._last:
            return False
        request = scheduler_pb2.ReportDevicesRequest(report=report_message(devices, usage, now=time.time()))
        try:
            response = self._stub.ReportDevices(request, timeout=self._timeout)
        except grpc.RpcError as err:
            detail = f"{err.code().name}: {err.details()}" if isinstance(err, grpc.Call) else str(err)
            raise SchedulerUnavailable(f"scheduler at {self._address}: ReportDevices failed ({detail})") from err
        self._last = devices
        for orphan in response.orphaned_allocations:
            log.warning("scheduler holds an allocation on a GPU this node no longer reports: %s", orphan)
        return True

    def close(self) -> None:
        self._channel.close()
