"""`NodeDevices` in its gRPC form: the `fgpu.v1.NodeDeviceReport` of ReportDevices, both ways.

Every fact is written and read by walking the field table (apis/device_fields.py)
at its `proto` path; only the frame (node name, one GPU message each) is written here.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from apis import device_fields
from apis.device_fields import Kind, Record
from apis.fgpu.v1 import device_pb2
from apis.inventory import GPUInfo, NodeDevices


def to_proto(devices: NodeDevices) -> device_pb2.NodeDeviceReport:
    """The ReportDevices form of `devices` (observed_at and usage are the caller's to fill)."""
    report = device_pb2.NodeDeviceReport(node_name=devices.node_name)
    for gpu in devices.gpus:
        _write(report.gpus.add(), device_fields.GPU, gpu)
    _write(report, device_fields.NODE, devices)
    return report


def from_proto(report: device_pb2.NodeDeviceReport) -> NodeDevices:
    """`NodeDevices` from a report; a GPU whose health is unspecified counts as unhealthy."""
    values = _read(report, device_fields.NODE)
    values["node_name"] = report.node_name
    values["gpus"] = tuple(gpu_from_proto(g) for g in report.gpus)
    devices: NodeDevices = device_fields.build(NodeDevices, values)
    return devices


def gpu_to_proto(gpu: GPUInfo) -> device_pb2.GPU:
    message = device_pb2.GPU()
    _write(message, device_fields.GPU, gpu)
    return message


def gpu_from_proto(message: device_pb2.GPU) -> GPUInfo:
    gpu: GPUInfo = device_fields.build(GPUInfo, _read(message, device_fields.GPU))
    return gpu


def _write(message: Message, record: Record, value: object) -> None:
    for field in record.fields:
        data = device_fields.value_of(value, field.attr)
        *path, name = field.proto.split(".")
        target = message
        for part in path:
            target = getattr(target, part)
            # Present even when every field inside is zero, as the message always was.
            target.SetInParent()
        if field.kind is Kind.RECORDS:
            assert field.records is not None
            repeated = getattr(target, name)
            for item in data:
                _write(repeated.add(), field.records, item)
        elif field.kind is Kind.HEALTH:
            setattr(target, name, device_pb2.HEALTHY if data else device_pb2.UNHEALTHY)
        else:
            setattr(target, name, data)


def _read(message: Message, record: Record) -> dict[str, object]:
    """Values by attr; a field under an unset message is left out, so it takes its dataclass default."""
    values: dict[str, object] = {}
    for field in record.fields:
        *path, name = field.proto.split(".")
        target: Any = message
        for part in path:
            if not target.HasField(part):
                # An unset topology reads as zeros; the dataclass says "unknown" (-1) instead.
                break
            target = getattr(target, part)
        else:
            data = getattr(target, name)
            if field.kind is Kind.RECORDS:
                assert field.records is not None
                records = field.records
                values[field.attr] = tuple(device_fields.build(records.cls, _read(m, records)) for m in data)
            elif field.kind is Kind.HEALTH:
                values[field.attr] = data == device_pb2.HEALTHY
            else:
                values[field.attr] = data
    return values
