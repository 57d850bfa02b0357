"""The Device CRD manifest: a valid, structural CRD with Koordinator's schema and fgpu's names."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from apis import names
from tests.apis_codec.crd_schema import device_schema, load_crd, pruned_paths, validation_errors

KOORDLET_DEVICE = Path(__file__).with_name("koordlet_device.yaml")


def schema_nodes(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from schema_nodes(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), Mapping):
        yield from schema_nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from schema_nodes(schema["additionalProperties"], f"{path}{{}}")


def test_manifest_is_a_valid_apiextensions_v1_crd() -> None:
    kubernetes_validate.validate(load_crd(), "1.29", strict=True)


def test_crd_serves_the_device_kind_under_the_names_fgpu_uses() -> None:
    crd = load_crd()

    assert crd["metadata"]["name"] == f"{names.DEVICE_PLURAL}.{names.DEVICE_GROUP}"
    assert crd["spec"]["group"] == names.DEVICE_GROUP
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == names.DEVICE_KIND
    assert crd["spec"]["names"]["plural"] == names.DEVICE_PLURAL
    assert [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]] == [
        (names.DEVICE_VERSION, True, True)
    ]


def test_schema_is_structural_every_node_typed_unless_int_or_string() -> None:
    untyped = [
        path
        for path, node in schema_nodes(device_schema())
        if "type" not in node and not node.get("x-kubernetes-int-or-string")
    ]

    assert untyped == []


def test_device_entries_have_koordinators_fields() -> None:
    entry = device_schema()["properties"]["spec"]["properties"]["devices"]["items"]

    assert set(entry["properties"]) == {
        "type", "id", "minor", "moduleID", "health", "labels", "resources", "topology", "vfGroups", "conditions"
    }
    assert entry["required"] == ["health"]
    assert set(entry["properties"]["topology"]["properties"]) == {"socketID", "nodeID", "pcieID", "busID"}
    assert entry["properties"]["resources"]["additionalProperties"]["x-kubernetes-int-or-string"] is True


def test_a_koordlet_written_device_is_accepted_whole() -> None:
    obj = yaml.safe_load(KOORDLET_DEVICE.read_text())

    assert validation_errors(obj) == []
    assert pruned_paths(obj) == []


def test_a_quantity_that_is_not_one_is_rejected() -> None:
    obj = yaml.safe_load(KOORDLET_DEVICE.read_text())
    obj["spec"]["devices"][0]["resources"][names.GPU_MEMORY] = "lots"

    assert any("resources/koordinator.sh/gpu-memory" in e for e in validation_errors(obj))


def test_fields_outside_the_schema_would_be_pruned() -> None:
    obj = yaml.safe_load(KOORDLET_DEVICE.read_text())
    obj["spec"]["devices"][0]["nvlinkPeers"] = []

    assert pruned_paths(obj) == ["/spec/devices/0/nvlinkPeers"]
