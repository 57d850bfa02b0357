"""The descheduler leaves room that is on its way to come, and lets a pod's own label opt it out.

Clusters are tests/review/test_descheduler_review.py's (three 1-GPU nodes: n1 two 20 % shares of
ReplicaSet `web`, n2 two 30 % shares of ReplicaSet `db`, in the opted-in namespace `prod`; n3 a
bare 50 % pod; the whole-GPU pod `tenant/train` pending), on the API double with graceful pod
deletion: a deleted pod stays, terminating, until its kubelet confirms.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from apis import names
from scheduler_plugin.descheduler import safety
from scheduler_plugin.descheduler.controller import Controller, Stats
from scheduler_plugin.descheduler.evictor import Evictor, Limits
from scheduler_plugin.descheduler.kube import DeschedulerKube
from tests.kubeapi import KubeAPIServer
from tests.review.test_descheduler_review import (
    NOW,
    TENANT,
    VICTIM_NODES,
    VICTIMS,
    _cluster,
    _leaving,
    _owned_pod,
    _pending,
    _running_share,
)

ALLOW = {names.DEFRAG_OPT_IN_LABEL: names.DEFRAG_OPT_IN_VALUE}
DENY = {names.DEFRAG_OPT_IN_LABEL: "deny"}


@pytest.fixture
def api() -> Iterator[KubeAPIServer]:
    with KubeAPIServer(graceful_pod_deletion=True) as server:
        yield server


@pytest.fixture
def kube(api: KubeAPIServer) -> Iterator[DeschedulerKube]:
    client = kubernetes.config.new_client_from_config(config_file=api.kubeconfig_path)  # type: ignore[no-untyped-call]
    connected = DeschedulerKube(client)
    yield connected
    connected.close()


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_plan_settles_even_when_its_room_was_taken_and_then_stops_the_evictor(
    api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    _cluster(api)
    _pending(api)
    clock = _Clock()
    evictor = Evictor(kube, Limits(dry_run=False), clock=clock)
    controller = Controller(kube, evictor, NOW, monotonic=clock)
    assert controller.cycle(Stats()).startswith(f"made room for {TENANT}/train")
    moved = _leaving(api)
    (node,) = {VICTIM_NODES[name] for name in moved}
    # The evicted pods finish shutting down; their ReplicaSet's new pods land in the room first.
    for name in moved:
        api.kubelet_confirm_deletion(VICTIMS, name)
    app = next(iter(moved)).partition("-")[0]
    for name in sorted(moved):
        _running_share(api, f"{name}-again", node, app, 20 if app == "web" else 30)
    clock.t += 60

    stats = Stats()
    line = controller.cycle(stats)

    assert _leaving(api) == moved, f"more pods were evicted for train while its plan settles: {line}"
    assert "settling" in line and stats.aborted == {"plan-settling": 1}, (line, stats.aborted)
    assert not evictor.stopped
    clock.t += NOW.settle_s
    controller.cycle(Stats())
    assert "still pending" in evictor.stopped


def test_a_pending_pod_kube_scheduler_nominated_a_node_for_is_left_alone(
    api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    _cluster(api)
    _pending(api, status={"phase": "Pending", "nominatedNodeName": "n3"})
    stats = Stats()

    line = Controller(kube, Evictor(kube, Limits(dry_run=False)), NOW).cycle(stats)

    assert _leaving(api) == set(), line
    assert stats.aborted == {"room-on-its-way": 1}
    assert "nominated to node n3" in line


def test_a_pending_pod_that_fits_once_a_deleted_pod_is_gone_is_left_alone(
    api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    _cluster(api)
    kube.evict_pod(VICTIMS, "bare")  # shutting down within its grace, not nominated for anyone
    _pending(api)
    stats = Stats()

    line = Controller(kube, Evictor(kube, Limits(dry_run=False)), NOW).cycle(stats)

    assert _leaving(api) == set(), line
    assert "fits once the 1 pod(s) being deleted are gone" in line


def test_a_pod_being_deleted_still_holds_its_share_when_its_leaving_is_not_enough(
    api: KubeAPIServer, kube: DeschedulerKube
) -> None:
    _cluster(api)
    kube.evict_pod(VICTIMS, "web-1")  # n1 keeps web-2's 20 %: the whole-GPU pod still fits nowhere
    _pending(api)

    line = Controller(kube, Evictor(kube, Limits(dry_run=False)), NOW).cycle(Stats())

    # Moving web-2 alone would not do while web-1 still shuts down on n1: n2's pods move.
    assert line.startswith(f"made room for {TENANT}/train on n2"), line
    assert _leaving(api) == {"web-1", "db-1", "db-2"}


@pytest.mark.parametrize(
    ("pod_labels", "namespace_labels", "movable"),
    [
        ({}, ALLOW, True),  # the namespace's word is the default
        ({}, {}, False),
        (ALLOW, {}, True),  # a pod author may opt their own pod in
        (DENY, ALLOW, False),  # ... or out: the pod's own label decides
        ({names.DEFRAG_OPT_IN_LABEL: ""}, ALLOW, False),  # present but not `allow`
        (ALLOW, DENY, True),
        (DENY, {}, False),
    ],
)
def test_the_pods_own_defrag_label_decides_and_its_namespaces_is_the_default(
    pod_labels: dict[str, Any], namespace_labels: dict[str, Any], movable: bool
) -> None:
    pod = _owned_pod("ReplicaSet", "apps/v1")
    pod["metadata"]["labels"] = dict(pod_labels)

    reason = safety.why_not_movable(pod, namespace_labels)

    assert (reason == "") is movable, reason
