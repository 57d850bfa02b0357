"""Discovery as the client's DynamicClient reads it, and the kubeconfig as the only configuration."""

from __future__ import annotations

import kubernetes
from kubernetes import client, dynamic

from apis import names
from tests.kubeapi import KubeAPIServer
from tests.kubeapi_tests.objects import device, node


def test_the_dynamic_client_finds_built_in_kinds_and_installed_crds(
    api_client: client.ApiClient, custom: client.CustomObjectsApi
) -> None:
    custom.create_cluster_custom_object(
        names.DEVICE_GROUP, names.DEVICE_VERSION, names.DEVICE_PLURAL, device("n1")
    )
    dyn = dynamic.DynamicClient(api_client)
    devices = dyn.resources.get(
        api_version=f"{names.DEVICE_GROUP}/{names.DEVICE_VERSION}", kind=names.DEVICE_KIND
    )
    assert devices.namespaced is False
    assert [d.metadata.name for d in devices.get().items] == ["n1"]
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    assert {s for s in pods.subresources} == {"status", "binding", "eviction"}
    leases = dyn.resources.get(api_version="coordination.k8s.io/v1", kind="Lease")
    assert leases.namespaced is True


def test_version_endpoint_answers(api_client: client.ApiClient) -> None:
    info = client.VersionApi(api_client).get_code()
    assert info.major == "1"


def test_load_kube_config_is_all_production_code_needs(kube_api: KubeAPIServer) -> None:
    configuration = client.Configuration()
    kubernetes.config.load_kube_config(
        config_file=kube_api.kubeconfig_path, client_configuration=configuration
    )
    with client.ApiClient(configuration) as api:
        client.CoreV1Api(api).create_node(node("n1"))
    assert kube_api.get_object("/api/v1/nodes/n1") is not None
