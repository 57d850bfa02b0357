"""The API double's Eviction subresource, through the official client: PodDisruptionBudgets hold."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes
import pytest
from kubernetes import client

from scheduler_plugin.errors import KubeAPIError
from scheduler_plugin.kube import Kube
from tests.kubeapi import KubeAPIServer


@pytest.fixture
def api(kube_api: KubeAPIServer) -> Iterator[client.ApiClient]:
    api_client = kubernetes.config.new_client_from_config(config_file=kube_api.kubeconfig_path)
    yield api_client
    api_client.close()


def _running_pod(core: client.CoreV1Api, name: str, labels: dict[str, str]) -> None:
    core.create_namespaced_pod(
        "default", {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    )
    core.patch_namespaced_pod_status(name, "default", {"status": {"phase": "Running"}})


def _budget(policy: client.PolicyV1Api, name: str, allowed: int) -> None:
    policy.create_namespaced_pod_disruption_budget(
        "default",
        {"metadata": {"name": name}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": name}}}},
    )
    policy.patch_namespaced_pod_disruption_budget_status(
        name, "default", {"status": {"disruptionsAllowed": allowed, "observedGeneration": 1,
                                     "currentHealthy": 2, "desiredHealthy": 2, "expectedPods": 2}}
    )


def _evict(core: client.CoreV1Api, name: str) -> None:
    core.create_namespaced_pod_eviction(name, "default", {"metadata": {"name": name, "namespace": "default"}})


def test_an_eviction_the_budget_allows_deletes_the_pod_and_spends_the_budget(api: client.ApiClient) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    _running_pod(core, "web-1", {"app": "web"})
    _running_pod(core, "web-2", {"app": "web"})
    _budget(policy, "web", 1)
    _evict(core, "web-1")
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["web-2"]
    status = policy.read_namespaced_pod_disruption_budget("web", "default").status
    assert status.disruptions_allowed == 0
    assert "web-1" in status.disrupted_pods
    with pytest.raises(client.ApiException) as refused:
        _evict(core, "web-2")
    assert refused.value.status == 429
    assert "disruption budget" in refused.value.body
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["web-2"]


def test_pods_no_budget_covers_and_pending_pods_are_evicted_freely(api: client.ApiClient) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    _budget(policy, "db", 0)
    _running_pod(core, "free", {"app": "other"})
    core.create_namespaced_pod(
        "default", {"metadata": {"name": "db-pending", "labels": {"app": "db"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    )
    _evict(core, "free")
    _evict(core, "db-pending")
    assert core.list_namespaced_pod("default").items == []


def test_a_pod_two_budgets_cover_cannot_be_evicted(api: client.ApiClient) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    _running_pod(core, "x", {"app": "x"})
    for name in ("x", "x2"):
        policy.create_namespaced_pod_disruption_budget(
            "default", {"metadata": {"name": name}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "x"}}}}
        )
    with pytest.raises(client.ApiException) as refused:
        _evict(core, "x")
    assert refused.value.status == 500
    with pytest.raises(client.ApiException) as missing:
        _evict(core, "nobody")
    assert missing.value.status == 404


def test_the_schedulers_kube_evicts_through_the_subresource_and_reports_the_budgets_refusal(api: client.ApiClient) -> None:
    core, policy = client.CoreV1Api(api), client.PolicyV1Api(api)
    _running_pod(core, "web-1", {"app": "web"})
    _running_pod(core, "web-2", {"app": "web"})
    _budget(policy, "web", 1)
    kube = Kube(api)
    kube.evict_pod("default", "web-1", grace=30)
    with pytest.raises(KubeAPIError) as refused:
        kube.evict_pod("default", "web-2")
    assert refused.value.status == 429
    with pytest.raises(KubeAPIError) as gone:
        kube.evict_pod("default", "web-1")
    assert gone.value.status == 404
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["web-2"]
    assert "default" in {ns["metadata"]["name"] for ns in kube.list_namespaces().items}


def test_an_eviction_with_another_pods_uid_as_precondition_is_refused_and_the_pod_stays(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    _running_pod(core, "db-0", {"app": "db"})
    kube = Kube(api)
    with pytest.raises(KubeAPIError) as replaced:
        kube.evict_pod("default", "db-0", uid="uid-of-the-db-0-that-was-planned")
    assert replaced.value.status == 409
    assert "Precondition failed: UID" in str(replaced.value)
    current = core.read_namespaced_pod("db-0", "default").metadata.uid
    kube.evict_pod("default", "db-0", uid=current)
    assert core.list_namespaced_pod("default").items == []
