"""A Device object goes through a Kubernetes API server and the official client unchanged.

The API double prunes and validates custom resources against the installed
CRD as apiextensions does, so this shows the agent's object and a koordlet
object survive the real round trip, not just our own schema walk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from apis import names
from apis.devices import from_device_object, to_device_object
from tests.apis_codec.crd_schema import CRD_PATH
from tests.apis_codec.test_devices import NODE
from tests.kubeapi.server import KubeAPIServer

KOORDLET_DEVICE = Path(__file__).with_name("koordlet_device.yaml")


@pytest.fixture
def devices_api(kube_api: KubeAPIServer) -> kubernetes.client.CustomObjectsApi:
    kube_api.install_crd(str(CRD_PATH))
    client = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kube_api.kubeconfig_path
    )
    return kubernetes.client.CustomObjectsApi(client)


def create(api: kubernetes.client.CustomObjectsApi, obj: dict[str, Any]) -> None:
    api.create_cluster_custom_object(names.DEVICE_GROUP, names.DEVICE_VERSION, names.DEVICE_PLURAL, obj)


def read(api: kubernetes.client.CustomObjectsApi, name: str) -> dict[str, Any]:
    got = api.get_cluster_custom_object(names.DEVICE_GROUP, names.DEVICE_VERSION, names.DEVICE_PLURAL, name)
    assert isinstance(got, dict)
    return got


def test_the_agents_device_object_reads_back_unchanged(devices_api: kubernetes.client.CustomObjectsApi) -> None:
    create(devices_api, to_device_object(NODE, node_uid="uid-n1"))

    stored = read(devices_api, "n1")

    assert from_device_object(stored) == NODE
    assert stored["metadata"]["ownerReferences"][0]["uid"] == "uid-n1"


def test_a_koordlet_device_object_keeps_every_field(devices_api: kubernetes.client.CustomObjectsApi) -> None:
    obj = yaml.safe_load(KOORDLET_DEVICE.read_text())
    create(devices_api, obj)

    stored = read(devices_api, obj["metadata"]["name"])

    assert stored["spec"] == obj["spec"]
    assert [g.minor for g in from_device_object(stored).gpus] == [0, 1]

