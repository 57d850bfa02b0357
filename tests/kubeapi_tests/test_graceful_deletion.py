"""Graceful pod deletion (opt-in): a bound pod terminates until its kubelet confirms, as in a real cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.kubeapi import KubeAPIServer
from tests.kubeapi_tests.objects import pod
from tests.kubeapi_tests.watching import collect


@pytest.fixture
def graceful_api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer(graceful_pod_deletion=True) as server:
        yield server


@pytest.fixture
def core(graceful_api: KubeAPIServer) -> Iterator[client.CoreV1Api]:
    api = kubernetes.config.new_client_from_config(config_file=graceful_api.kubeconfig_path)
    yield client.CoreV1Api(api)
    api.close()


def _create(core: client.CoreV1Api, body: dict[str, Any]) -> str:
    return str(core.create_namespaced_pod("default", body).metadata.resource_version)


def _gone(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, "default")
    except ApiException as exc:
        assert exc.status == 404
        return True
    return False


def test_deleting_a_bound_pod_leaves_it_terminating_with_its_grace_period(core: client.CoreV1Api) -> None:
    rv = _create(core, pod("p1", node="n1"))
    answered = core.delete_namespaced_pod("p1", "default")
    assert answered.metadata.deletion_timestamp is not None
    stored = core.read_namespaced_pod("p1", "default")
    assert stored.metadata.deletion_timestamp is not None
    assert stored.metadata.deletion_grace_period_seconds == 30
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["p1"]
    assert collect(core.list_namespaced_pod, "default", count=1, timeout_s=1, resource_version=rv) == [
        ("MODIFIED", "p1")
    ]


def test_the_kubelets_delete_with_grace_zero_removes_the_terminating_pod(core: client.CoreV1Api) -> None:
    rv = _create(core, pod("p1", node="n1"))
    core.delete_namespaced_pod("p1", "default")
    core.delete_namespaced_pod("p1", "default", grace_period_seconds=0)
    assert _gone(core, "p1")
    assert collect(core.list_namespaced_pod, "default", count=3, resource_version=rv) == [
        ("MODIFIED", "p1"),
        ("MODIFIED", "p1"),
        ("DELETED", "p1"),
    ]


def test_kubelet_confirm_deletion_acts_as_the_kubelet(graceful_api: KubeAPIServer, core: client.CoreV1Api) -> None:
    _create(core, pod("p1", node="n1"))
    core.delete_namespaced_pod("p1", "default")
    graceful_api.kubelet_confirm_deletion("default", "p1")
    assert _gone(core, "p1")
    with pytest.raises(ValueError, match="no pod default/p1"):
        graceful_api.kubelet_confirm_deletion("default", "p1")


def test_the_grace_comes_from_delete_options_else_from_the_pod_spec(core: client.CoreV1Api) -> None:
    _create(core, pod("opts", node="n1"))
    core.delete_namespaced_pod("opts", "default", body=client.V1DeleteOptions(grace_period_seconds=5))
    assert core.read_namespaced_pod("opts", "default").metadata.deletion_grace_period_seconds == 5
    spec_grace = pod("spec", node="n1")
    spec_grace["spec"]["terminationGracePeriodSeconds"] = 7
    _create(core, spec_grace)
    core.delete_namespaced_pod("spec", "default")
    assert core.read_namespaced_pod("spec", "default").metadata.deletion_grace_period_seconds == 7


def test_a_later_delete_may_shorten_the_grace_but_never_extend_it(core: client.CoreV1Api) -> None:
    _create(core, pod("p1", node="n1"))
    core.delete_namespaced_pod("p1", "default", grace_period_seconds=20)
    first = core.read_namespaced_pod("p1", "default").metadata
    core.delete_namespaced_pod("p1", "default", grace_period_seconds=60)
    assert core.read_namespaced_pod("p1", "default").metadata.resource_version == first.resource_version
    core.delete_namespaced_pod("p1", "default", grace_period_seconds=5)
    shortened = core.read_namespaced_pod("p1", "default").metadata
    assert shortened.deletion_grace_period_seconds == 5
    assert (first.deletion_timestamp - shortened.deletion_timestamp).total_seconds() == 15


def test_an_unbound_pod_goes_at_once_after_a_last_modified_event(core: client.CoreV1Api) -> None:
    rv = _create(core, pod("p1"))
    core.delete_namespaced_pod("p1", "default")
    assert _gone(core, "p1")
    # The real registry stores the deletionTimestamp (grace 0) before removing the pod.
    assert collect(core.list_namespaced_pod, "default", count=2, resource_version=rv) == [
        ("MODIFIED", "p1"),
        ("DELETED", "p1"),
    ]


def test_a_finished_bound_pod_goes_at_once(core: client.CoreV1Api) -> None:
    _create(core, pod("p1", node="n1"))
    core.patch_namespaced_pod_status("p1", "default", {"status": {"phase": "Succeeded"}})
    core.delete_namespaced_pod("p1", "default")
    assert _gone(core, "p1")


def test_finalizers_still_hold_a_pod_the_kubelet_has_confirmed(
    graceful_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    rv = _create(core, pod("p1", node="n1", finalizers=["fgpu.io/release"]))
    core.delete_namespaced_pod("p1", "default")
    graceful_api.kubelet_confirm_deletion("default", "p1")
    held = core.read_namespaced_pod("p1", "default").metadata
    assert (held.deletion_grace_period_seconds, held.finalizers) == (0, ["fgpu.io/release"])
    core.patch_namespaced_pod("p1", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    assert _gone(core, "p1")
    # Removing the last finalizer of a pod due now deletes it in that update: no MODIFIED first.
    assert collect(core.list_namespaced_pod, "default", count=3, resource_version=rv) == [
        ("MODIFIED", "p1"),
        ("MODIFIED", "p1"),
        ("DELETED", "p1"),
    ]


def test_a_terminating_pod_whose_finalizers_went_waits_for_the_kubelet(
    graceful_api: KubeAPIServer, core: client.CoreV1Api
) -> None:
    _create(core, pod("p1", node="n1", finalizers=["fgpu.io/release"]))
    core.delete_namespaced_pod("p1", "default")
    core.patch_namespaced_pod("p1", "default", [{"op": "remove", "path": "/metadata/finalizers"}])
    assert core.read_namespaced_pod("p1", "default").metadata.deletion_grace_period_seconds == 30
    graceful_api.kubelet_confirm_deletion("default", "p1")
    assert _gone(core, "p1")


def test_without_the_option_a_bound_pod_goes_at_once(kube_api: KubeAPIServer) -> None:
    api = kubernetes.config.new_client_from_config(config_file=kube_api.kubeconfig_path)
    core = client.CoreV1Api(api)
    _create(core, pod("p1", node="n1"))
    core.delete_namespaced_pod("p1", "default")
    assert _gone(core, "p1")
    api.close()
