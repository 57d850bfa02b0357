"""The field table carries every fact of a node's report through both wire forms.

A value with every field set to something other than its default goes through
the gRPC message and the Device object and must come back equal: a field the
table (or a codec) misses comes back as its default and fails here.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor

from apis import device_fields, names
from apis.device_fields import NODE_FRAME, Field, Record
from apis.devices import NodeDevices, from_device_object, from_proto, to_device_object, to_proto
from apis.fgpu.v1 import device_pb2
from tests.apis_codec.test_devices import through_api_server

DOCS = Path(__file__).parents[2] / "docs" / "device-fields.md"
#: Fields of the report message that are no GPU fact: when it was taken, and the usage beside it.
REPORT_ONLY = {"observed_at", "usage"}


def every_field_set(cls: type[Any], numbers: Iterator[int], *, flags: bool | None = None) -> Any:
    """A `cls` whose every field (nested values and records included) differs from its default.

    With `flags`, every bool is that value instead: a Device reads a missing flag as false, whatever
    the dataclass default, so a forgotten `healthy` shows only in a sample where it is true.
    """
    hints = typing.get_type_hints(cls)
    values: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if kind is str:
            values[f.name] = f"{cls.__name__}.{f.name}"
        elif kind is bool:
            values[f.name] = (f.default is not True) if flags is None else flags
        elif kind is int:
            values[f.name] = next(numbers)
        elif typing.get_origin(kind) is tuple:
            values[f.name] = (every_field_set(typing.get_args(kind)[0], numbers, flags=flags),)
        elif dataclasses.is_dataclass(kind):
            values[f.name] = every_field_set(typing.cast(type[Any], kind), numbers, flags=flags)
        else:
            raise AssertionError(f"{cls.__name__}.{f.name}: no non-default value for {kind}; teach every_field_set")
    return cls(**values)


def full_node(*, flags: bool | None = None) -> NodeDevices:
    node: NodeDevices = every_field_set(NodeDevices, itertools.count(3), flags=flags)
    return node


def paths_of(cls: type[Any]) -> set[str]:
    """Dotted dataclass fields, through nested values (a GPU's topology) but not into tuples of records."""
    hints = typing.get_type_hints(cls)
    out = set()
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out |= {f"{f.name}.{p}" for p in paths_of(typing.cast(type[Any], kind))}
        else:
            out.add(f.name)
    return out


def all_records() -> list[Record]:
    found: list[Record] = []

    def visit(record: Record) -> None:
        if record not in found:
            found.append(record)
            for f in record.fields:
                if f.records is not None:
                    visit(f.records)

    visit(device_fields.NODE)
    visit(device_fields.GPU)
    return found


def proto_paths(descriptor: Descriptor, *, skip: set[str]) -> set[str]:
    """Dotted message fields, through nested messages but not into repeated ones (tables of their own)."""
    out = set()
    for f in descriptor.fields:
        if f.name in skip:
            continue
        if f.message_type is not None and not f.is_repeated:
            out |= {f"{f.name}.{p}" for p in proto_paths(f.message_type, skip=set())}
        else:
            out.add(f.name)
    return out


def message_of(record: Record) -> Descriptor:
    return {
        "NodeDevices": device_pb2.NodeDeviceReport.DESCRIPTOR,
        "GPUInfo": device_pb2.GPU.DESCRIPTOR,
        "MIGInstance": device_pb2.MIGInstance.DESCRIPTOR,
        "MIGProfile": device_pb2.MIGProfile.DESCRIPTOR,
        "MIGPlacement": device_pb2.MIGPlacement.DESCRIPTOR,
        "NVLinkPeer": device_pb2.NVLinkPeer.DESCRIPTOR,
        "ExternalHolder": device_pb2.ExternalHolder.DESCRIPTOR,
    }[record.cls.__name__]


def through_proto(devices: NodeDevices) -> NodeDevices:
    return from_proto(device_pb2.NodeDeviceReport.FromString(to_proto(devices).SerializeToString()))


def through_device_object(devices: NodeDevices) -> NodeDevices:
    return from_device_object(through_api_server(to_device_object(devices, node_uid="uid")))


def through_json(devices: NodeDevices) -> NodeDevices:
    """The Device object as JSON, without the CRD schema (which would reject an entry missing a field)."""
    return from_device_object(json.loads(json.dumps(to_device_object(devices))))


@pytest.mark.parametrize("record", all_records(), ids=lambda r: r.cls.__name__)
def test_the_table_names_every_field_of_the_value_once(record: Record) -> None:
    attrs = [f.attr for f in record.fields]
    frame = set(NODE_FRAME) if record is device_fields.NODE else set()

    assert len(attrs) == len(set(attrs))
    assert set(attrs) | frame == paths_of(record.cls)


@pytest.mark.parametrize("record", all_records(), ids=lambda r: r.cls.__name__)
def test_the_table_names_every_field_of_the_message(record: Record) -> None:
    frame = set(NODE_FRAME) if record is device_fields.NODE else set()
    skip = REPORT_ONLY if record is device_fields.NODE else set()

    assert {f.proto for f in record.fields} | frame == proto_paths(message_of(record), skip=skip)


def test_every_field_of_the_sample_differs_from_its_default() -> None:
    node = full_node()

    for record, value in [(device_fields.NODE, node), (device_fields.GPU, node.gpus[0])]:
        for f in record.fields:
            assert device_fields.value_of(value, f.attr) != device_fields.default_of(record.cls, f.attr), f.attr


@pytest.mark.parametrize("flags", [None, True, False], ids=["non-default", "flags-true", "flags-false"])
def test_a_report_with_every_field_set_survives_the_grpc_message(flags: bool | None) -> None:
    node = full_node(flags=flags)

    assert through_proto(node) == node


@pytest.mark.parametrize("flags", [None, True, False], ids=["non-default", "flags-true", "flags-false"])
def test_a_report_with_every_field_set_survives_the_device_object(flags: bool | None) -> None:
    node = full_node(flags=flags)

    assert through_device_object(node) == node


def test_koordinators_fields_are_in_the_spec_and_every_other_fact_in_the_extras() -> None:
    node = full_node()
    obj = to_device_object(node)
    extras = json.loads(obj["metadata"]["annotations"][names.DEVICE_EXTRAS])
    entry = obj["spec"]["devices"][0]

    for f in device_fields.GPU.fields:
        if isinstance(f.device, device_fields.Koordinator):
            target = entry
            for part in f.device.path:
                target = target[part]
        else:
            assert f.device.key in extras["gpus"][node.gpus[0].uuid], f.attr
    for f in device_fields.NODE.fields:
        assert isinstance(f.device, device_fields.Extra) and f.device.key in extras, f.attr


def test_the_docs_name_every_field_and_where_it_travels() -> None:
    text = DOCS.read_text(encoding="utf-8")

    for record in all_records():
        for f in record.fields:
            where = f.device.key if isinstance(f.device, device_fields.Extra) else f.device.path[-1]
            assert f"`{f.attr}`" in text and where in text, f"{record.cls.__name__}.{f.attr}: add it to {DOCS.name}"


def without(record: Record, dropped: Field) -> Record:
    """`record` with `dropped` left out, wherever in its tree of tables it is."""
    fields = []
    for f in record.fields:
        if f is dropped:
            continue
        if f.records is not None:
            f = dataclasses.replace(f, records=without(f.records, dropped))
        fields.append(f)
    return Record(record.cls, tuple(fields))


@pytest.mark.parametrize(
    "dropped",
    [f for r in all_records() for f in r.fields],
    ids=lambda f: f.attr,
)
@pytest.mark.parametrize("form", [through_proto, through_json], ids=["grpc", "device-object"])
def test_a_field_the_table_forgets_fails_the_round_trip(
    dropped: Field, form: typing.Callable[[NodeDevices], NodeDevices], monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = [full_node(), full_node(flags=True)]
    monkeypatch.setattr(device_fields, "NODE", without(device_fields.NODE, dropped))
    monkeypatch.setattr(device_fields, "GPU", without(device_fields.GPU, dropped))

    try:
        back = [form(node) for node in samples]
    except (TypeError, KeyError):  # a required field nobody read
        return
    assert back != samples
