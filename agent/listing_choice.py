"""Which listing of the node's pods counts when the agent has both the Kubernetes API and the container runtime.

Pure: the adapter (`agent.podsources.EitherPods`) does the listing and hands
the outcomes here. The rules, for a ledger that must never under-count (a
share held by a running container handed out twice) and never wait on a peer
it does not need:

- The API first: it knows each pod's phase and whether kubelet created a
  container, and it is what the scheduler sees.
- The API failed or did not answer in time: the runtime's pod sandboxes. Its
  READY sandboxes are every pod that can run a container on the node, and
  their annotations are the ones the hook verified when it admitted them, so
  the ledger rebuilt from them is as complete as one rebuilt from the API.
- Both failed: nothing; the caller keeps GPU admissions waiting.
- The rebuild (`add_unlisted`) also reads the runtime when the API answered and
  adds the pods the API does not list at all but whose sandbox is READY: a pod
  force-deleted from the API keeps running until kubelet kills it, and its
  share is still taken. A pod the API does list keeps the API's word (a
  finished phase means its containers ended). The sweep does not ask the
  runtime then: releasing what the API no longer lists is its job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from agent.admissionsweep import PodSeen


@dataclass(frozen=True)
class Listing:
    """One source's answer: its pods, or (pods None) why it could not list them."""

    #: The source's `where`, e.g. "on node gpu-1 (Kubernetes API)".
    where: str
    pods: tuple[PodSeen, ...] | None
    error: str = ""

    @property
    def answered(self) -> bool:
        return self.pods is not None


@dataclass(frozen=True)
class Chosen:
    """The pods to use and, for logs, where they came from; pods None: no source answered, wait."""

    pods: tuple[PodSeen, ...] | None
    where: str


def chosen_pods(api: Listing, runtime: Listing | None, *, add_unlisted: bool) -> Chosen:
    """Pure: the pods that count, from the API's listing and the runtime's (None: not asked)."""
    if api.pods is not None:
        if not add_unlisted or runtime is None or runtime.pods is None:
            return Chosen(api.pods, api.where)
        listed = {p.uid for p in api.pods}
        extra = _live_pods_not_in(runtime.pods, listed)
        pods = _with_sandboxes(api.pods, runtime.pods)
        if not extra:
            return Chosen(pods, api.where)
        return Chosen(pods + extra, (
            f"{api.where}, and {runtime.where} for {len({p.uid for p in extra})} pod(s) still running there "
            "that the API no longer lists"
        ))
    if runtime is not None and runtime.pods is not None:
        return Chosen(runtime.pods, f"{runtime.where}, because listing them {api.where} failed: {api.error}")
    tried = [api] if runtime is None else [api, runtime]
    return Chosen(None, "; ".join(f"{t.where}: {t.error}" for t in tried))


def _with_sandboxes(pods: Sequence[PodSeen], runtime: Sequence[PodSeen]) -> tuple[PodSeen, ...]:
    """The API's pods, each with the runtime's sandbox ID where the pod has exactly one READY sandbox:
    the ledger then knows which sandbox's stop may free the pod's shares."""
    ready: dict[str, list[str]] = {}
    for p in runtime:
        if not p.finished and p.sandbox_id:
            ready.setdefault(p.uid, []).append(p.sandbox_id)
    return tuple(
        replace(p, sandbox_id=ready[p.uid][0]) if not p.sandbox_id and len(ready.get(p.uid, ())) == 1 else p
        for p in pods
    )


def _live_pods_not_in(pods: Sequence[PodSeen], listed: set[str]) -> tuple[PodSeen, ...]:
    """Every listing of the pods with a READY sandbox whose UID is not in `listed`.

    All of a pod's sandboxes are kept, the stopped ones too: the rebuild picks the live one.
    """
    live = {p.uid for p in pods if not p.finished and p.uid not in listed}
    return tuple(p for p in pods if p.uid in live)
