from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler_plugin.errors import NotLeader
from scheduler_plugin.kube import Kube
from scheduler_plugin.leader import LeaderElector, LeaseRecord, may_take, next_record
from tests.kubeapi.server import KubeAPIServer

WALL = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def record(holder: str, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, "t0", "t1", 3)


def test_a_lease_held_by_another_is_taken_only_after_it_stayed_unchanged_for_its_duration() -> None:
    held = record("other")

    assert not may_take(record=held, identity="me", observed_at=100.0, now=114.9, lease_duration_s=15)
    assert may_take(record=held, identity="me", observed_at=100.0, now=115.0, lease_duration_s=15)


def test_an_empty_or_own_lease_may_always_be_written() -> None:
    assert may_take(record=record(""), identity="me", observed_at=100.0, now=100.0, lease_duration_s=15)
    assert may_take(record=record("me"), identity="me", observed_at=100.0, now=100.0, lease_duration_s=15)


def test_taking_over_counts_a_transition_and_renewing_keeps_the_acquire_time() -> None:
    taken = next_record(current=record("other"), identity="me", lease_duration_s=15, wall=WALL)
    renewed = next_record(current=taken, identity="me", lease_duration_s=15, wall=WALL.replace(second=5))

    assert (taken.holder, taken.transitions, taken.acquire_time) == ("me", 4, "2024-05-01T12:00:00.000000Z")
    assert (renewed.transitions, renewed.acquire_time, renewed.renew_time) == (4, taken.acquire_time, "2024-05-01T12:00:05.000000Z")


def test_two_candidates_never_both_hold_the_lease(kube_api: KubeAPIServer) -> None:
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path)
    now = [0.0]
    common = {"kube": kube, "namespace": "kube-system", "name": "fgpu-scheduler", "lease_duration_s": 10.0,
              "renew_deadline_s": 6.0, "retry_period_s": 1.0, "clock": lambda: now[0]}
    a = LeaderElector(identity="a", **common)  # type: ignore[arg-type]
    b = LeaderElector(identity="b", **common)  # type: ignore[arg-type]

    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    now[0] = 9.0
    assert not b.try_acquire_or_renew()
    now[0] = 10.5  # unchanged for longer than the lease since b first saw it (at 0), and a did not renew
    assert b.try_acquire_or_renew()
    assert not a.try_acquire_or_renew()
    lease = kube.get_lease(namespace="kube-system", name="fgpu-scheduler")
    assert lease is not None and lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    kube.close()


def test_a_started_elector_fences_pod_writes_through_its_kube_until_it_stops_leading(kube_api: KubeAPIServer) -> None:
    pod = kube_api.put_object(
        "/api/v1/namespaces/default/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
    )
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path)
    now = [0.0]
    elector = LeaderElector(
        kube=kube, namespace="kube-system", name="fgpu-scheduler", identity="a",
        lease_duration_s=10.0, renew_deadline_s=6.0, retry_period_s=3600.0, clock=lambda: now[0],
    )
    elector.start()
    try:
        kube.patch_pod_metadata(namespace="default", name="p", metadata={"labels": {"leading": "yes"}})
        now[0] = 6.5  # not renewed within the renew deadline: a standby may soon take the lease

        with pytest.raises(NotLeader, match="a does not hold lease kube-system/fgpu-scheduler"):
            kube.patch_pod_metadata(namespace="default", name="p", metadata={"labels": {"leading": "no"}})
        with pytest.raises(NotLeader):
            kube.bind_pod(namespace="default", name="p", uid=pod["metadata"]["uid"], node="n1")
    finally:
        elector.stop(release=False)
        kube.close()
    stored = kube_api.get_object("/api/v1/namespaces/default/pods/p")
    assert stored is not None and stored["metadata"]["labels"] == {"leading": "yes"} and not stored["spec"].get("nodeName")
