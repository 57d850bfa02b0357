"""A kubelet per simulated node: watches (polls) the pods the API binds to its node and runs them
through that node's fgpu-runtime-proxy, as kubelet would.

- A new pod: RunPodSandbox with the pod's labels and annotations, init containers to
  completion, app containers started and left running; each container's own
  environment is read with ExecSync (`env`), which is what the invariants check.
- A refused container (the proxy fails GPU pods closed while the agent is down) is
  retried with back-off, as kubelet does.
- A pod whose annotations changed while it runs gets its first app container
  re-created (next attempt) with the current annotations, as kubelet does when a
  container restarts: the way an edited allocation would reach the node.
- A terminating pod: containers and sandbox stopped and removed, then the
  deletion confirmed (DELETE, grace 0, uid precondition), as kubelet confirms.
- Sandboxes are found by pod UID, as kubelet finds them (`sandboxes.py`): a
  RunPodSandbox whose answer was lost may have made one. Killing a pod removes
  every sandbox with its UID; a new try at a pod's sandbox first removes any
  earlier one; and every `GC_EVERY_S` sandboxes of pods neither in the API nor
  tracked are removed (kubelet's garbage collection).

Ownership: the driver labels its sandboxes `fgpu.soak/node=<node>` and only ever
touches sandboxes with that label (see stack.py on sharing one containerd).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from bench.soak import sandboxes
from bench.soak.kubeclient import ALL_PODS, PODS, ApiError, Client
from bench.soak.stack import Node
from hack.localup import cri, podrun
from hack.localup.report import ContainerOutcome, ContainerState

NODE_LABEL = "fgpu.soak/node"
RETRY_S = 1.0
#: How often sandboxes of pods that are gone are looked for (kubelet's GC runs every minute).
GC_EVERY_S = 10.0
_GC = "<gc>"


@dataclass
class Tracked:
    pod: dict[str, Any]
    run: podrun.PodRun | None = None
    running_at: float = 0.0
    next_try: float = 0.0
    tries: int = 0
    annotations: dict[str, str] = field(default_factory=dict)
    last_error: str = ""
    removing: bool = False
    #: a RunPodSandbox was sent for this pod: a sandbox may exist even when no answer came
    sandbox_asked: bool = False


@dataclass(frozen=True)
class SeenContainer:
    """One app container running now, with the env it printed and the pod it belongs to."""

    node: str
    pod: dict[str, Any]
    container: str
    env: dict[str, str]
    annotations: dict[str, str]


class NodeDriver:
    def __init__(
        self, node: Node, api_url: str, *, on_running: Callable[[str, float], None], workers: int = 4,
        pod_cgroups: bool = False,
    ) -> None:
        """`pod_cgroups`: each pod in its own cgroup, as kubelet makes it (`podrun.start`)."""
        self.node = node
        self._pod_cgroups = pod_cgroups
        self._client = Client(api_url, timeout_s=5.0)
        self._kubelet = cri.Kubelet(f"unix://{node.proxy_sock}", timeout_s=20.0)
        self._lister = sandboxes.SandboxLister(f"unix://{node.proxy_sock}")
        self._next_gc = time.monotonic() + GC_EVERY_S
        #: sandboxes removed that no tracked pod knew of (answers lost, pods gone): kubelet's GC finds these
        self.strays_removed = 0
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"kubelet-{node.name}")
        self._lock = threading.Lock()
        self._tracked: dict[str, Tracked] = {}
        self._busy: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"kubelet-{node.name}", daemon=True)
        self._on_running = on_running
        self.errors: list[str] = []
        self.removed = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._kubelet.close()
        self._lister.close()

    # --- what the invariants read ------------------------------------------------------------
    def running_containers(self) -> list[SeenContainer]:
        seen = []
        with self._lock:
            for t in self._tracked.values():
                run = t.run
                if run is None or t.removing:
                    continue
                for outcome in list(run.outcomes.values()):
                    if outcome.state is ContainerState.RUNNING and not outcome.init and outcome.env:
                        seen.append(SeenContainer(node=self.node.name, pod=t.pod, container=outcome.name,
                                                  env=dict(outcome.env), annotations=dict(run.annotations)))
        return seen

    def pods(self) -> dict[str, Tracked]:
        with self._lock:
            return dict(self._tracked)

    def sandboxes(self) -> int:
        with self._lock:
            return sum(1 for t in self._tracked.values() if t.run is not None)

    # --- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                listed = self._client.list(ALL_PODS, fieldSelector=f"spec.nodeName={self.node.name}")
            except ApiError:
                continue  # the API is down: what runs keeps running
            now = time.monotonic()
            present = set()
            for pod in listed:
                uid = pod["metadata"]["uid"]
                present.add(uid)
                with self._lock:
                    t = self._tracked.setdefault(uid, Tracked(pod=pod))
                    t.pod = pod
                    if uid in self._busy:
                        continue
                    action = self._next_action(t, now)
                    if action is None:
                        continue
                    self._busy.add(uid)
                self._pool.submit(self._do, uid, action)
            with self._lock:
                gone = [u for u, t in self._tracked.items() if u not in present and u not in self._busy]
                for uid in gone:
                    self._busy.add(uid)
            for uid in gone:
                self._pool.submit(self._do, uid, self._forget)
            if now >= self._next_gc:
                with self._lock:
                    start_gc = _GC not in self._busy
                    self._busy.add(_GC)
                if start_gc:
                    self._next_gc = now + GC_EVERY_S
                    self._pool.submit(self._collect, present)

    def _collect(self, present: set[str]) -> None:
        """Removes this node's sandboxes whose pod is neither in the API nor tracked (kubelet's GC)."""
        try:
            for sandbox in self._lister.list({NODE_LABEL: self.node.name}):
                with self._lock:
                    known = sandbox.pod_uid in present or sandbox.pod_uid in self._tracked
                if not known:
                    self.strays_removed += sandboxes.remove_all(
                        self._kubelet, self._lister, {NODE_LABEL: self.node.name, cri.POD_UID_LABEL: sandbox.pod_uid})
        except cri.CRIError as exc:
            self.errors.append(f"sandbox GC: {exc}")
        finally:
            with self._lock:
                self._busy.discard(_GC)

    def _next_action(self, t: Tracked, now: float) -> Callable[[Tracked], None] | None:
        meta = t.pod["metadata"]
        if meta.get("deletionTimestamp"):
            return self._terminate
        if now < t.next_try:
            return None
        if t.run is None:
            return self._start
        annotations = dict(meta.get("annotations") or {})
        if annotations != t.annotations:
            return self._recreate
        if any(o.state in (ContainerState.REFUSED, ContainerState.NOT_RUN) for o in t.run.outcomes.values()):
            return self._resume
        if any(o.state is ContainerState.RUNNING and not o.env for o in t.run.outcomes.values()):
            return self._read_env
        return None

    def _do(self, uid: str, action: Callable[[Tracked], None]) -> None:
        with self._lock:
            t = self._tracked.get(uid)
        try:
            if t is not None:
                action(t)
        except (cri.CRIError, podrun.PodSpecError, ApiError, OSError) as exc:
            if t is not None:
                t.last_error = str(exc)
                t.tries += 1
                t.next_try = time.monotonic() + min(RETRY_S * t.tries, 5.0)
        finally:
            with self._lock:
                self._busy.discard(uid)

    # --- actions ---------------------------------------------------------------------------------
    def _start(self, t: Tracked) -> None:
        pod = t.pod
        annotations = dict(pod["metadata"].get("annotations") or {})
        labeled = {**pod, "metadata": {**pod["metadata"],
                                       "labels": {**(pod["metadata"].get("labels") or {}), NODE_LABEL: self.node.name}}}
        t.annotations = annotations
        if t.sandbox_asked:
            # An earlier RunPodSandbox got no answer but may have made a sandbox; it holds the name
            # (the runtime refuses a second one) and would outlive the pod. kubelet would not reuse a
            # sandbox it cannot account for either: it is removed, then made again.
            self.strays_removed += self._remove_sandboxes(t)
        t.sandbox_asked = True
        t.run = podrun.start(self._kubelet, labeled, annotations=annotations, node=self.node.name,
                             pods_dir=self.node.pods_dir, pod_cgroups=self._pod_cgroups)
        self._run(t)

    def _resume(self, t: Tracked) -> None:
        self._run(t)

    def _run(self, t: Tracked) -> None:
        assert t.run is not None
        podrun.run(self._kubelet, t.run, leave_running=True, timeout_s=20)
        outcomes = t.run.outcomes.values()
        if any(o.state in (ContainerState.REFUSED, ContainerState.NOT_RUN) for o in outcomes):
            t.tries += 1
            t.last_error = t.run.problem()
            t.next_try = time.monotonic() + min(RETRY_S * t.tries, 5.0)
            return
        if not t.running_at and all(o.state is ContainerState.RUNNING for o in outcomes if not o.init):
            t.running_at = time.monotonic()
            self._on_running(t.pod["metadata"]["uid"], t.running_at)

    def _read_env(self, t: Tracked) -> None:
        assert t.run is not None
        for name, o in list(t.run.outcomes.items()):
            if o.state is ContainerState.RUNNING and not o.env:
                result = self._kubelet.exec_sync(o.container_id, ["env"])
                from hack.localup import report

                t.run.outcomes[name] = replace(o, env=report.env_from_lines(result.stdout.splitlines()), error="")

    def _recreate(self, t: Tracked) -> None:
        """The first app container exits and is created again, with the pod's annotations as they are now."""
        assert t.run is not None
        run = t.run
        annotations = dict(t.pod["metadata"].get("annotations") or {})
        meta = run.pod["metadata"]
        new_config = cri.sandbox_config(
            name=str(meta["name"]), namespace=str(meta["namespace"]), uid=str(meta["uid"]),
            labels=meta.get("labels") or {}, annotations=annotations,
            log_directory=str(run.sandbox_config.log_directory),
        )
        t.annotations = annotations
        apps = [c["name"] for c in (run.pod.get("spec") or {}).get("containers") or []]
        old = run.outcomes.get(apps[0]) if apps else None
        if old is not None and old.container_id:
            with contextlib.suppress(cri.CRIError):
                self._kubelet.stop_container(old.container_id, timeout_s=0)
        with self._lock:
            # Under the lock `running_containers` reads with: a container is never paired with
            # annotations other than those it was created with.
            if old is not None:
                run.outcomes[apps[0]] = ContainerOutcome(name=apps[0], state=ContainerState.NOT_RUN)
            run.sandbox_config = new_config
        self._run(t)

    def _terminate(self, t: Tracked) -> None:
        t.removing = True
        if t.run is not None:
            podrun.remove(self._kubelet, t.run)
            # podrun.remove swallows errors; RemovePodSandbox is idempotent, so asking again
            # unguarded makes a containerd that was down mean "try again", not a leak.
            if t.run.sandbox_id:
                self._kubelet.remove_pod_sandbox(t.run.sandbox_id)
        if t.sandbox_asked:
            self.strays_removed += self._remove_sandboxes(t)  # by UID, as kubelet's killPod finds them
        meta = t.pod["metadata"]
        self._client.delete(f"{PODS.format(ns=meta['namespace'])}/{meta['name']}", grace_s=0, uid=meta["uid"])
        with self._lock:
            self._tracked.pop(meta["uid"], None)
        self.removed += 1

    def _forget(self, t: Tracked) -> None:
        """A pod gone from the API without our confirmation (force-deleted): its containers go too."""
        t.removing = True
        if t.run is not None:
            podrun.remove(self._kubelet, t.run)
            if t.run.sandbox_id:
                self._kubelet.remove_pod_sandbox(t.run.sandbox_id)
        if t.sandbox_asked:
            self.strays_removed += self._remove_sandboxes(t)
        with self._lock:
            self._tracked.pop(t.pod["metadata"]["uid"], None)
        self.removed += 1

    def _remove_sandboxes(self, t: Tracked) -> int:
        """Every sandbox of this pod on this node, found by its UID label, stopped and removed. Called
        when the driver holds none of them (`_start`) or has removed the one it holds (kill): each one
        found is one the driver had no handle on."""
        labels = {NODE_LABEL: self.node.name, cri.POD_UID_LABEL: str(t.pod["metadata"]["uid"])}
        return sandboxes.remove_all(self._kubelet, self._lister, labels)
