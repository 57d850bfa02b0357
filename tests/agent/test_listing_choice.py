"""With both the Kubernetes API and the container runtime, which listing of the node's pods counts."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import pytest

from agent.admissionsweep import PodSeen
from agent.errors import KubeAPIError, RuntimeUnavailable
from agent.listing_choice import Listing, chosen_pods
from agent.podsources import EitherPods
from tests.waiting import wait_until as _wait

API = "on node n (Kubernetes API)"
CRI = "on node n (container runtime at unix:///run/containerd/containerd.sock)"
A, B = PodSeen(uid="a"), PodSeen(uid="b")
B_STOPPED = PodSeen(uid="b", finished=True)
A_FINISHED = PodSeen(uid="a", finished=True)


def api(*pods: PodSeen) -> Listing:
    return Listing(API, pods)


def cri(*pods: PodSeen) -> Listing:
    return Listing(CRI, pods)


API_DOWN = Listing(API, None, "did not answer within 5s")
CRI_DOWN = Listing(CRI, None, "ListPodSandbox failed (UNAVAILABLE)")


@dataclass(frozen=True)
class Case:
    api: Listing
    runtime: Listing | None
    add_unlisted: bool
    #: None: no source answered, GPU admissions wait.
    uids: tuple[str, ...] | None
    where_has: tuple[str, ...] = ()


CASES = {
    "the api answers: its pods, the runtime not asked": Case(api(A), None, False, ("a",), (API,)),
    "the api answers and lists nothing: nothing, not the runtime's": Case(api(), cri(A), False, ()),
    "the api fails: the runtime's pods, saying why": Case(API_DOWN, cri(A), False, ("a",), (CRI, API, "did not answer")),
    "the rebuild with the api failing: the runtime's pods": Case(API_DOWN, cri(A, B), True, ("a", "b")),
    "both fail: wait, naming both": Case(API_DOWN, CRI_DOWN, True, None, ("did not answer", "UNAVAILABLE")),
    "the api fails with no runtime: wait": Case(API_DOWN, None, False, None, ("did not answer",)),
    "the rebuild adds a pod still running that the api no longer lists": Case(
        api(A), cri(A, B), True, ("a", "b"), (API, CRI, "1 pod(s) still running there"),
    ),
    "the rebuild takes the api's word on a pod it lists as finished": Case(api(A_FINISHED), cri(A), True, ("a",), (API,)),
    "the rebuild does not add a pod whose sandboxes are all stopped": Case(api(A), cri(A, B_STOPPED), True, ("a",)),
    "the rebuild adds all sandboxes of an unlisted pod, so its live one is read": Case(
        api(), cri(B_STOPPED, B), True, ("b", "b"),
    ),
    "the rebuild with the runtime down: the api's pods": Case(api(A), CRI_DOWN, True, ("a",), (API,)),
    "the sweep never adds the runtime's pods": Case(api(A), cri(A, B), False, ("a",)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_chosen_pods(case: Case) -> None:
    chosen = chosen_pods(case.api, case.runtime, add_unlisted=case.add_unlisted)
    assert (None if chosen.pods is None else tuple(p.uid for p in chosen.pods)) == case.uids
    for text in case.where_has:
        assert text in chosen.where


@pytest.mark.parametrize(
    ("runtime", "expected"),
    [
        ((PodSeen(uid="a", sandbox_id="sb-1"),), "sb-1"),
        ((PodSeen(uid="a", finished=True, sandbox_id="sb-0"), PodSeen(uid="a", sandbox_id="sb-1")), "sb-1"),
        # two READY sandboxes (kubelet mid re-creation): which one runs the containers is not known
        ((PodSeen(uid="a", sandbox_id="sb-1"), PodSeen(uid="a", sandbox_id="sb-2")), ""),
        ((PodSeen(uid="a", finished=True, sandbox_id="sb-0"),), ""),
    ],
)
def test_the_rebuild_learns_each_api_pods_live_sandbox_from_the_runtime(runtime: tuple[PodSeen, ...], expected: str) -> None:
    # The ledger needs it to tell a late stop of an old sandbox from the stop of the pod's own.
    chosen = chosen_pods(api(A), cri(*runtime), add_unlisted=True)
    assert chosen.pods is not None
    assert [(p.uid, p.sandbox_id) for p in chosen.pods] == [("a", expected)]


# --- EitherPods against two sources ------------------------------------------------------------------


class Source:
    """A PodSource that lists what the test says, fails like a peer that is down, or hangs until released."""

    def __init__(self, where: str, *pods: PodSeen, error: Exception | None = None) -> None:
        self.where = where
        self.pods = list(pods)
        self.error = error
        self.calls = 0
        self.hang = threading.Event()
        self.hang.set()

    def list_pods(self) -> list[PodSeen]:
        self.calls += 1
        self.hang.wait(5)
        if self.error is not None:
            raise self.error
        return list(self.pods)


def test_the_runtime_is_asked_only_when_the_api_fails_and_the_log_says_when_the_source_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    k8s, runtime = Source(API, A), Source(CRI, A, B)
    pods = EitherPods(k8s, runtime, add_unlisted=False, api_wait_s=1.0)
    assert pods.where == f"{API}, else {CRI}"
    with caplog.at_level(logging.INFO, logger="agent.podsources"):
        assert [p.uid for p in pods.list_pods()] == ["a"] and runtime.calls == 0
        k8s.error = KubeAPIError("Kubernetes API: 503 unavailable", status=503)
        assert [p.uid for p in pods.list_pods()] == ["a", "b"] and runtime.calls == 1
        assert pods.where.startswith(CRI) and "503 unavailable" in pods.where
        k8s.error = None
        assert [p.uid for p in pods.list_pods()] == ["a"] and pods.where == API
    assert [(r.levelname, r.getMessage()[:11]) for r in caplog.records] == [
        ("WARNING", "pods listed"), ("INFO", "pods listed"),
    ]
    assert CRI in caplog.records[0].getMessage() and API in caplog.records[1].getMessage()


def test_neither_source_answering_raises_an_error_the_agent_retries_naming_both() -> None:
    pods = EitherPods(
        Source(API, error=KubeAPIError("Kubernetes API unreachable: connection refused")),
        Source(CRI, error=RuntimeUnavailable("container runtime at unix:///x.sock: ListPodSandbox failed")),
        add_unlisted=True, api_wait_s=1.0,
    )
    with pytest.raises(RuntimeUnavailable, match=r"connection refused.*ListPodSandbox failed"):
        pods.list_pods()


def test_a_hung_api_is_waited_for_boundedly_and_not_asked_again_while_its_call_runs() -> None:
    k8s, runtime = Source(API, A), Source(CRI, B)
    k8s.hang.clear()
    pods = EitherPods(k8s, runtime, add_unlisted=False, api_wait_s=0.05)
    try:
        assert [p.uid for p in pods.list_pods()] == ["b"]
        assert "did not answer within 0.05s" in pods.where
        assert [p.uid for p in pods.list_pods()] == ["b"]
        assert k8s.calls == 1 and "earlier listing" in pods.where
    finally:
        k8s.hang.set()
    # Once the hung call has ended, the next listing asks the API afresh.
    _wait(lambda: [p.uid for p in pods.list_pods()] == ["a"])
    assert (k8s.calls, pods.where) == (2, API)
