"""A fenced write fits in the time before a standby may take the lease: one try, with that as its timeout.

And the standby counts that time from when it *received* the leader's renewal, not from when it asked.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler_plugin import config as scheduler_config
from scheduler_plugin.config import ConfigError, LeaderElectionConfig, SchedulerConfig
from scheduler_plugin.errors import KubeAPIError, NotLeader
from scheduler_plugin.kube import Kube
from scheduler_plugin.leader import FENCE_SAFETY_GAP_S, LeaderElector, fencing_problem
from tests.kubeapi.server import KubeAPIServer

LEASE = {"namespace": "kube-system", "name": "fgpu-scheduler", "lease_duration_s": 10.0, "renew_deadline_s": 6.0,
         "retry_period_s": 3600.0}


def test_the_fence_gives_a_write_the_time_until_a_standby_could_take_the_lease_less_the_safety_gap(
    kube_api: KubeAPIServer,
) -> None:
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path)
    now = [0.0]
    elector = LeaderElector(kube=kube, identity="a", clock=lambda: now[0], **LEASE)  # type: ignore[arg-type]
    elector.start()  # renewed at 0: a standby may take the lease at 10 at the earliest
    try:
        now[0] = 2.0
        assert elector.check_lead() == pytest.approx(10.0 - FENCE_SAFETY_GAP_S - 2.0)
        now[0] = 5.9  # the last moment it leads: still more than the margin left
        assert elector.check_lead() == pytest.approx(10.0 - FENCE_SAFETY_GAP_S - 5.9)
        now[0] = 6.0
        with pytest.raises(NotLeader):
            elector.check_lead()
    finally:
        elector.stop(release=False)
        kube.close()


def test_a_fenced_binding_gives_up_when_the_fence_says_its_time_is_up_though_the_api_server_never_answers(
    kube_api: KubeAPIServer,
) -> None:
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path, request_timeout_s=10.0)
    kube.fence_pod_writes(lambda: 0.4)
    kube_api.pause()
    try:
        started = time.monotonic()
        with pytest.raises(KubeAPIError, match="unreachable"):
            kube.bind_pod(namespace="default", name="p", uid="u", node="n1")
        assert time.monotonic() - started < 1.5  # not the 10 s request timeout
    finally:
        kube_api.resume()
        kube.close()


@pytest.fixture
def unanswered_port() -> Iterator[int]:
    """A port whose listener's accept queue is full: the kernel drops every SYN, so connecting times out."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filling = []
    for _ in range(3):
        conn = socket.socket()
        conn.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            conn.connect(("127.0.0.1", port))
        filling.append(conn)
    time.sleep(0.1)
    yield port
    for conn in filling:
        conn.close()
    listener.close()


def test_a_fenced_write_is_sent_once_a_connection_that_times_out_is_not_tried_again(
    kube_api: KubeAPIServer, unanswered_port: int, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(Path(kube_api.kubeconfig_path).read_text().replace(kube_api.url, f"http://127.0.0.1:{unanswered_port}"))
    kube = Kube.connect(kubeconfig=str(kubeconfig), request_timeout_s=1.0)
    kube.fence_pod_writes(lambda: 5.0)
    try:
        started = time.monotonic()
        with pytest.raises(KubeAPIError, match="unreachable"):
            kube.bind_pod(namespace="default", name="p", uid="u", node="n1")
        # urllib3's default retries would connect 4 times, 1 s each: the Binding could leave 3 s after its check.
        assert time.monotonic() - started < 2.5
    finally:
        kube.close()


class SlowLeaseReads(Kube):
    """A Kube whose lease reads take `delay` seconds of the test's clock."""

    clock: list[float]
    delay = 0.0

    def get_lease(self, **kwargs: Any) -> dict[str, Any] | None:
        lease = super().get_lease(**kwargs)
        self.clock[0] += self.delay
        return lease


def test_a_standby_counts_the_lease_from_when_its_read_arrived_not_from_when_it_asked(kube_api: KubeAPIServer) -> None:
    now = [0.0]
    leader_kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path)
    standby_kube = SlowLeaseReads.connect(kubeconfig=kube_api.kubeconfig_path)
    assert isinstance(standby_kube, SlowLeaseReads)
    standby_kube.clock = now
    a = LeaderElector(kube=leader_kube, identity="a", clock=lambda: now[0], **LEASE)  # type: ignore[arg-type]
    b = LeaderElector(kube=standby_kube, identity="b", clock=lambda: now[0], **LEASE)  # type: ignore[arg-type]
    try:
        assert a.try_acquire_or_renew()  # renewed at 0; a stops writing by 10 - 0.5 at the latest
        standby_kube.delay = 2.0
        assert not b.try_acquire_or_renew()  # asked at 0, the answer came at 2: a's record was first seen at 2
        standby_kube.delay = 0.0

        now[0] = 11.0  # 11 s after b asked, but only 9 s after it saw the record
        assert not b.try_acquire_or_renew()
        now[0] = 12.0
        assert b.try_acquire_or_renew()
    finally:
        leader_kube.close()
        standby_kube.close()


@pytest.mark.parametrize(("lease", "renew"), [(3.0, 2.5), (11.0, 10.0), (15.0, 14.5)])
def test_lease_settings_that_leave_a_binding_no_time_before_a_standby_may_take_over_are_refused(
    lease: float, renew: float
) -> None:
    settings = SchedulerConfig(
        leader_election=LeaderElectionConfig(lease_duration_s=lease, renew_deadline_s=renew, retry_period_s=1.0)
    )

    with pytest.raises(ConfigError) as refused:
        scheduler_config.validate(settings)

    message = str(refused.value)
    assert "leaseDurationSeconds - renewDeadlineSeconds" in message
    assert f"= {lease - renew:g}s" in message and "safety gap" in message
    assert "e.g. leaseDurationSeconds 15, renewDeadlineSeconds 10" in message


def test_the_deployed_lease_settings_give_every_binding_four_and_a_half_seconds() -> None:
    scheduler_config.validate(SchedulerConfig())  # 15 / 10
    assert fencing_problem(lease_duration_s=15.0, renew_deadline_s=10.0) == ""
    assert 15.0 - 10.0 - FENCE_SAFETY_GAP_S == 4.5


def test_an_elector_whose_margin_is_not_larger_than_the_safety_gap_is_refused(kube_api: KubeAPIServer) -> None:
    kube = Kube.connect(kubeconfig=kube_api.kubeconfig_path)
    try:
        with pytest.raises(ValueError, match="leaves no time for a fenced write"):
            LeaderElector(kube=kube, identity="a", **{**LEASE, "renew_deadline_s": 9.6})  # type: ignore[arg-type]
    finally:
        kube.close()
