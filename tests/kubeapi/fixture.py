"""The `kube_api` pytest fixture, registered for every test folder by tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kubeapi.server import KubeAPIServer


@pytest.fixture
def kube_api() -> Iterator[KubeAPIServer]:
    """A started `KubeAPIServer`; point clients at `kube_api.kubeconfig_path`."""
    with KubeAPIServer() as server:
        yield server
