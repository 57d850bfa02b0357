"""The admission sweep's and the ledger rebuild's `PodSource`s: the Kubernetes API, the container runtime (CRI), and
the API with the runtime to fall back on (`EitherPods`, when the agent has both).

Each turns what its peer lists into `PodSeen` values (UID, finished, name,
annotations); the decisions stay in `agent.admissionsweep.stale_admissions`
(which entries to release), `agent.ledger_rebuild.restored_admissions`
(which entries to restore after a restart) and `agent.listing_choice.chosen_pods`
(which source's listing counts).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from agent.admissionsweep import PodSeen, PodSource
from agent.criclient import RuntimeClient, Sandbox
from agent.errors import RuntimeUnavailable
from agent.kube import JSON, Kube
from agent.listing_choice import Listing, chosen_pods

log = logging.getLogger(__name__)

#: How long a listing waits for the API before it uses the runtime. The Kubernetes client's own
#: timeout is per try, and it tries a hung server four times: 40 s at the agent's 10 s.
API_WAIT_S = 5.0

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def pods_seen(items: Iterable[JSON]) -> list[PodSeen]:
    """Pod objects -> PodSeen; an item without a uid cannot match any entry and is skipped."""
    seen: list[PodSeen] = []
    for item in items:
        meta = item.get("metadata")
        status = item.get("status")
        meta = meta if isinstance(meta, dict) else {}
        uid = meta.get("uid")
        phase = status.get("phase") if isinstance(status, dict) else None
        if isinstance(uid, str) and uid:
            seen.append(PodSeen(
                uid=uid,
                finished=phase in FINISHED_PHASES,
                name=_name(meta.get("namespace"), meta.get("name")),
                annotations=_text_map(meta.get("annotations")),
                started=_has_container(status),
                created=str(meta.get("creationTimestamp") or ""),
            ))
    return seen


def sandboxes_seen(sandboxes: Iterable[Sandbox], *, with_containers: frozenset[str] = frozenset()) -> list[PodSeen]:
    """Sandboxes -> PodSeen: a NOTREADY (stopped) sandbox is a finished pod.

    A pod whose sandbox was recreated is listed twice, the old one stopped;
    `stale_admissions` keeps it while any of them is ready, and the rebuild
    reads the ready one. `with_containers`: the IDs of the sandboxes with a
    created container, whose pods are `started`.
    """
    return [
        PodSeen(
            uid=s.pod_uid,
            finished=not s.ready,
            name=_name(s.pod_namespace, s.pod_name),
            annotations=s.annotations,
            started=s.id in with_containers,
            sandbox_id=s.id,
            created=f"{s.created_at_ns:020d}" if s.created_at_ns else "",
        )
        for s in sandboxes
        if s.pod_uid
    ]


def _has_container(status: object) -> bool:
    """Whether kubelet reports a created container (one with a containerID) for the pod."""
    if not isinstance(status, dict):
        return False
    for key in ("containerStatuses", "initContainerStatuses"):
        for entry in status.get(key) or []:
            if isinstance(entry, dict) and entry.get("containerID"):
                return True
    return False


def _name(namespace: object, name: object) -> str:
    if not isinstance(name, str) or not name:
        return ""
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def _text_map(value: object) -> dict[str, str]:
    # The API only stores strings here; anything else is not an annotation we could verify.
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


class KubePods:
    """The pods bound to the node, from the API server."""

    def __init__(self, kube: Kube, *, node_name: str) -> None:
        self._kube = kube
        self._node = node_name
        self.where = f"on node {node_name} (Kubernetes API)"

    def list_pods(self) -> list[PodSeen]:
        return pods_seen(self._kube.list_pods_on_node(self._node))


class RuntimePods:
    """The pod sandboxes of the node's container runtime, over CRI."""

    def __init__(self, runtime: RuntimeClient, *, node_name: str) -> None:
        self._runtime = runtime
        self.where = f"on node {node_name} (container runtime at {runtime.endpoint})"

    def list_pods(self) -> list[PodSeen]:
        sandboxes = self._runtime.list_pod_sandboxes()
        # Listed after the sandboxes: a container made in between marks a sandbox listed already.
        return sandboxes_seen(sandboxes, with_containers=self._runtime.sandboxes_with_containers())


class EitherPods:
    """The API's pods, or the runtime's when the API fails or does not answer within `api_wait_s`.

    `add_unlisted` (the ledger rebuild): the runtime is read even when the API
    answered, for pods it still runs that the API no longer lists
    (`agent.listing_choice`). `where` names the source of the last listing.
    Thread-safe.
    """

    def __init__(
        self, api: PodSource, runtime: PodSource, *, add_unlisted: bool, api_wait_s: float | None = None
    ) -> None:
        self._api = api
        self._runtime = runtime
        self._add_unlisted = add_unlisted
        self._wait = API_WAIT_S if api_wait_s is None else api_wait_s
        self._lock = threading.Lock()
        self._where = f"{api.where}, else {runtime.where}"
        #: The API call still running from an earlier listing, waited for by none.
        self._straggler: threading.Thread | None = None
        self._on_runtime = False

    @property
    def where(self) -> str:
        with self._lock:
            return self._where

    def list_pods(self) -> list[PodSeen]:
        """Raises RuntimeUnavailable, naming both failures, when neither source lists the pods."""
        api = self._list_api()
        runtime = _listing(self._runtime) if not api.answered or self._add_unlisted else None
        chosen = chosen_pods(api, runtime, add_unlisted=self._add_unlisted)
        if chosen.pods is None:
            raise RuntimeUnavailable(f"no source could list the pods: {chosen.where}")
        on_runtime = not api.answered
        with self._lock:
            self._where = chosen.where
            changed = on_runtime != self._on_runtime
            self._on_runtime = on_runtime
        if changed and on_runtime:
            log.warning("pods listed %s", chosen.where)
        elif changed:
            log.info("pods listed %s again", self._api.where)
        return list(chosen.pods)

    def _list_api(self) -> Listing:
        """The API's listing, waiting at most `api_wait_s`; a call that outlives it runs on, unused.

        While one still runs the API is not asked again: the agent keeps at most one such thread,
        and every listing it uses began in this call (the sweep's grace counts from the call).
        """
        with self._lock:
            if self._straggler is not None and self._straggler.is_alive():
                return Listing(self._api.where, None, "did not answer an earlier listing yet")
            result: list[Listing] = []
            call = threading.Thread(target=lambda: result.append(_listing(self._api)), name="list-pods-api", daemon=True)
            self._straggler = call
            call.start()
        call.join(self._wait)
        if result:
            return result[0]
        return Listing(self._api.where, None, f"did not answer within {self._wait:g}s")


def _listing(source: PodSource) -> Listing:
    try:
        return Listing(source.where, tuple(source.list_pods()))
    except Exception as err:  # whatever it raised, the other source may still answer
        return Listing(source.where, None, str(err))
