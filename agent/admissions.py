"""What the hook has admitted on this node: pod UID -> the GPU shares it holds.

The scheduler's allocation is checked against the node as it is, but a
signed allocation alone says nothing about the other pods already running on
the same GPU: two pods each signed for 60% of one GPU would both pass a
per-pod check. The ledger remembers every admitted pod's shares so the hook
can reject the one that overcommits.

Fed by PreCreateContainer admissions, released by PostStopPodSandbox (and,
with a Kubernetes client or a CRI endpoint, by `agent.admissionsweep` for
pods whose PostStopPodSandbox never arrived; hence each entry's admission time).
Recording a pod UID again replaces its entry, so restarts and several
containers of one pod never count twice. Each entry remembers the sandbox its
last container was created in: when kubelet re-creates a pod's sandbox, the old
one's StopPodSandbox may come after the new sandbox's containers were admitted
(the proxy notifies in the background, and kubelet's garbage collector stops an
old sandbox again before it removes it), and must then free nothing
(`runs_in_another_sandbox`).

The ledger lives in memory, so after an agent restart it is rebuilt
(`agent.ledger_rebuild`) from the verified allocations of the pods still
running on the node, listed from Kubernetes or the container runtime, before
the hook admits anyone. When that listing fails the ledger starts empty (the
next admissions go through without counting the running pods, never blocking
anyone) and the rebuild is retried until a listing succeeds; `restore` then
adds only the pods the hook has not recorded itself in the meantime.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Hold:
    """One share an admitted pod holds: part of a whole GPU, or one MIG instance of it."""

    gpu_uuid: str
    core_percent: int = 0
    memory_bytes: int = 0
    #: Set for a MIG share; such a share holds the instance, not core or memory of the GPU.
    mig_uuid: str = ""
    #: Set for a MIG instance the node creates for the pod (docs/mig.md): its profile and the
    #: memory slice it starts at. `mig_uuid` is then the created instance's, or "" until it exists.
    mig_profile: str = ""
    mig_placement: int = -1
    #: A share of the whole GPU with 0% compute and no compute limit: the backends read 0% as no
    #: limit, so it may use all the card's compute and never shares a card with compute (docs/isolation.md).
    memory_only: bool = False

    @property
    def mig(self) -> bool:
        return bool(self.mig_uuid or self.mig_profile)

    @property
    def mig_key(self) -> str:
        """What identifies the instance held: its UUID, or where it is to be created."""
        return self.mig_uuid or f"{self.mig_profile}@{self.mig_placement}"


@dataclass(frozen=True)
class GPUHeld:
    """What other admitted pods hold of one GPU."""

    core_percent: int = 0
    memory_bytes: int = 0
    #: Pods holding part of the whole GPU.
    pods: frozenset[str] = frozenset()
    #: MIG instance UUID -> the pods holding it.
    mig: Mapping[str, frozenset[str]] | None = None
    #: Memory slice a MIG instance the node creates (or created) starts at -> the pods holding it
    #: (claimed while the instance is made, before its UUID is known).
    mig_placements: Mapping[int, frozenset[str]] | None = None
    #: Pods (among `pods`) holding a memory-only share of it (`Hold.memory_only`).
    memory_only_pods: frozenset[str] = frozenset()


def held_by_gpu(entries: Iterable[tuple[str, tuple[Hold, ...]]]) -> dict[str, GPUHeld]:
    """Sum (pod UID, holds) pairs per GPU."""
    core: dict[str, int] = {}
    memory: dict[str, int] = {}
    pods: dict[str, set[str]] = {}
    mig: dict[str, dict[str, set[str]]] = {}
    places: dict[str, dict[int, set[str]]] = {}
    memory_only: dict[str, set[str]] = {}
    for pod_uid, holds in entries:
        for h in holds:
            if h.mig:
                mig.setdefault(h.gpu_uuid, {}).setdefault(h.mig_key, set()).add(pod_uid)
                if h.mig_profile:
                    places.setdefault(h.gpu_uuid, {}).setdefault(h.mig_placement, set()).add(pod_uid)
                continue
            core[h.gpu_uuid] = core.get(h.gpu_uuid, 0) + h.core_percent
            memory[h.gpu_uuid] = memory.get(h.gpu_uuid, 0) + h.memory_bytes
            pods.setdefault(h.gpu_uuid, set()).add(pod_uid)
            if h.memory_only:
                memory_only.setdefault(h.gpu_uuid, set()).add(pod_uid)
    return {
        uuid: GPUHeld(
            core_percent=core.get(uuid, 0),
            memory_bytes=memory.get(uuid, 0),
            pods=frozenset(pods.get(uuid, ())),
            mig={m: frozenset(p) for m, p in mig.get(uuid, {}).items()} or None,
            mig_placements={s: frozenset(p) for s, p in places.get(uuid, {}).items()} or None,
            memory_only_pods=frozenset(memory_only.get(uuid, ())),
        )
        for uuid in set(core) | set(mig)
    }


class AdmissionLedger:
    """The admitted pods of this node. Thread-safe.

    Callers that check and then record hold `lock` across both, so two pods
    racing for the last share of a GPU cannot both be admitted.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = threading.RLock()
        self._clock = clock
        self._pods: dict[str, tuple[Hold, ...]] = {}
        self._admitted_at: dict[str, float] = {}
        #: pod UID -> the sandbox its last admitted container was created in ("" not known)
        self._sandboxes: dict[str, str] = {}

    def held(self, *, excluding: str = "") -> dict[str, GPUHeld]:
        """Per GPU, what every admitted pod but `excluding` holds."""
        with self.lock:
            return held_by_gpu((uid, holds) for uid, holds in self._pods.items() if uid != excluding)

    def record(self, *, pod_uid: str, holds: Iterable[Hold], sandbox_id: str = "") -> None:
        """Admit `pod_uid` with `holds`, replacing what it held before (idempotent).

        `sandbox_id`: the pod sandbox the admitted container is created in ("" not known)."""
        with self.lock:
            self._pods[pod_uid] = tuple(holds)
            self._admitted_at[pod_uid] = self._clock()
            self._sandboxes[pod_uid] = sandbox_id

    def runs_in_another_sandbox(self, *, pod_uid: str, sandbox_id: str) -> bool:
        """True when the pod's containers were admitted in a sandbox other than `sandbox_id`, so
        `sandbox_id` stopping leaves the pod running: its shares stay held, and what the isolation
        backends keep for its containers stays too. False when either sandbox is not known."""
        with self.lock:
            admitted_in = self._sandboxes.get(pod_uid, "")
            return bool(sandbox_id and admitted_in and admitted_in != sandbox_id)

    def restore(
        self, entries: Iterable[tuple[str, tuple[Hold, ...]]], *, sandboxes: Mapping[str, str] | None = None
    ) -> list[str]:
        """Record the entries whose pod is not in the ledger yet; the UIDs restored.

        For the rebuild after a restart: an entry recorded by a real admission
        since then is newer than any listing, so it wins. `sandboxes`: the sandbox
        each pod runs in, where the listing said (`runs_in_another_sandbox`).
        """
        restored: list[str] = []
        with self.lock:
            now = self._clock()
            for pod_uid, holds in entries:
                if pod_uid in self._pods:
                    continue
                self._pods[pod_uid] = tuple(holds)
                self._admitted_at[pod_uid] = now
                self._sandboxes[pod_uid] = (sandboxes or {}).get(pod_uid, "")
                restored.append(pod_uid)
        return restored

    def release(self, *, pod_uid: str) -> bool:
        """Forget `pod_uid`; True when it was admitted. Releasing an unknown pod is fine."""
        with self.lock:
            self._admitted_at.pop(pod_uid, None)
            self._sandboxes.pop(pod_uid, None)
            return self._pods.pop(pod_uid, None) is not None

    def pods(self) -> dict[str, tuple[Hold, ...]]:
        with self.lock:
            return dict(self._pods)

    def admitted_at(self) -> dict[str, float]:
        """Pod UID -> when it was last recorded, on the ledger's clock."""
        with self.lock:
            return dict(self._admitted_at)
