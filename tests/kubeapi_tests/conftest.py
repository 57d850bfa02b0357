"""Clients of the double, built only from the kubeconfig it writes (as production code builds them)."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes
import pytest
from kubernetes import client

from tests.kubeapi import DEVICE_CRD, KubeAPIServer


@pytest.fixture
def api_client(kube_api: KubeAPIServer) -> Iterator[client.ApiClient]:
    api = kubernetes.config.new_client_from_config(config_file=kube_api.kubeconfig_path)
    yield api
    api.close()


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def custom(kube_api: KubeAPIServer, api_client: client.ApiClient) -> client.CustomObjectsApi:
    kube_api.install_crd(DEVICE_CRD)
    return client.CustomObjectsApi(api_client)
